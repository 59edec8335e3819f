// serve_gpt: an HTTP completion server for a GPT-family checkpoint (GPT-2, Llama-, Mistral-,
// Qwen- and MoE-family ones), any tensor-parallel size (mpiexec -n tp; pp = 1), as
// docs/DESIGN.md "Serving" specifies:
//   POST /v1/completions, POST /v1/chat/completions   OpenAI's request and response shapes, with
//                                                      server-sent events for "stream": true
//   GET /v1/models, GET /health
//   PUT /api                                           Megatron's text-generation server shape
// World rank 0 runs the HTTP server (cpp-httplib; one thread per connection) and the scheduler;
// every rank runs the model. Continuous batching: the scheduler admits waiting requests into free
// key-value-cache slots (a prefill each), and every step decodes one token for every running
// sequence together; sequences leave the batch as they finish. Rank 0 broadcasts each step's plan
// (prefills and the decode batch) so that the tensor-parallel ranks run the same forwards; only
// rank 0 samples. SIGTERM or SIGINT: new requests get 503, the running ones finish, exit 0.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

// cpp-httplib (Debian's libcpp-httplib-dev, header only)
#include <httplib.h>

#include "comm/mpi_job.hpp"
#include "common/error.hpp"
#include "common/rng.hpp"
#include "common/sha256.hpp"
#include "data/chat_template.hpp"
#include "data/hf_tokenizer.hpp"
#include "models/gpt_generator.hpp"
#include "models/sampling.hpp"
#include "runtime/app_driver.hpp"
#include "train/inference_model.hpp"
#include "train/stop_signal.hpp"

namespace po = boost::program_options;
using json = nlohmann::json;
using namespace trident;

namespace {

// SIGTERM reaches the app driver's watcher thread (train/stop_signal.hpp), recorded while a StopSignal
// is armed; SIGINT (Ctrl-C) comes here
std::atomic<int> g_sigint{0};
extern "C" void on_sigint(int sig) { g_sigint.store(sig); }
const StopSignal* g_stop = nullptr;
int stop_requested() { return g_sigint.load() != 0 ? g_sigint.load() : g_stop ? g_stop->seen() : 0; }

struct Options {
  std::string checkpoint, host = "127.0.0.1", api_key, model_name, chat_template;
  TokenizerOptions tok;
  int port = 8000, threads = 0;
  std::int64_t max_batch = 8, max_queue = 64, max_length = 0, max_body = 1 << 20;
  double kv_cache_mib = 0, timeout_s = 30;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---------------------------------------------------------------------------------------------
// Requests

struct HttpError {
  int status;
  std::string message, type = "invalid_request_error", param;
};

[[noreturn]] void bad(const std::string& message, const std::string& param = "") {
  throw HttpError{400, message, "invalid_request_error", param};
}

json error_body(const HttpError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", nullptr}}}};
}

// One generation request, parsed and checked (the same for every endpoint).
struct GenRequest {
  std::vector<std::int32_t> prompt;
  std::int64_t max_tokens = 16;
  SamplingParams sp;
  std::uint64_t seed = 0;
  int n = 1;
  int top_logprobs = -1;  // -1: no log-probabilities; k >= 0: the chosen token's and k alternatives
  bool stream = false, include_usage = false;
  std::vector<std::string> stop;       // stop strings (not part of the text)
  std::vector<std::int32_t> stop_ids;  // tokens that end a sequence (end of document, of turn)
};

// One sequence of a request (n of them).
struct Choice {
  std::vector<std::int32_t> tokens;  // generated, a stop token included
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<std::int32_t, double>>> tops;
  std::string text;       // what may be shown: complete UTF-8, stop strings cut, held back near one
  std::size_t shown = 0;  // tokens whose text is inside `text` (streamed log-probabilities)
  std::string finish;     // "" while running, then "stop" or "length"
  int slot = -1;
};

struct Job {
  GenRequest req;
  std::vector<Choice> choices;
  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> cancelled{false};
  bool done = false;
  double t_submit = 0, t_first = 0;  // seconds
  std::string id;
};

// ---------------------------------------------------------------------------------------------
// The engine: scheduler on rank 0, forwards on every rank

class Engine {
 public:
  Engine(const InferenceModel& im, GptGenerator& gen, std::int64_t slots, std::int64_t max_len, std::int64_t max_queue)
      : im_(im), gen_(gen), slots_(slots), L_(max_len), max_queue_(max_queue), free_slots_(slots),
        seqs_(static_cast<size_t>(slots)) {
    rank_ = mpi_job::world_rank();
    V_ = im.cfg.vocab_size;
    Vtok_ = im.tokenizer->vocab_size();
    hf_ = dynamic_cast<const HfTokenizer*>(im.tokenizer.get());
  }
  std::int64_t slots() const { return slots_; }
  std::int64_t max_len() const { return L_; }

  // HTTP threads. false: the queue is full or the server drains (503).
  bool submit(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lk(m_);
    // room: the free slots (as of the last step) and --max-queue waiting requests beyond them
    if (draining_ || static_cast<std::int64_t>(queue_.size()) >= max_queue_ + free_slots_) return false;
    job->t_submit = now_s();
    job->choices.resize(static_cast<size_t>(job->req.n));
    queue_.push_back(job);
    ++in_flight_;
    cv_.notify_all();
    return true;
  }
  void request_finished() {  // a handler has sent its response
    std::lock_guard<std::mutex> lk(m_);
    --in_flight_;
    cv_.notify_all();
  }
  bool draining() const {
    std::lock_guard<std::mutex> lk(m_);
    return draining_;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    return hf_ ? hf_->decode(ids, true) : im_.tokenizer->decode(ids);
  }
  std::string token_text(std::int32_t id) const { return decode({id}); }

  // Every rank: runs until rank 0 has drained after a signal.
  void run();

 private:
  struct Seq {
    std::shared_ptr<Job> job;
    int choice = -1;
    bool prefilled = false;
  };
  bool running() const {
    for (const Seq& s : seqs_)
      if (s.job) return true;
    return false;
  }
  std::vector<std::int64_t> plan();                  // rank 0
  void execute(const std::vector<std::int64_t>& p);  // every rank
  void after_token(std::int64_t slot, const float* logits);
  void release(const std::shared_ptr<Job>& job);

  const InferenceModel& im_;
  GptGenerator& gen_;
  std::int64_t slots_, L_, max_queue_, V_ = 0, Vtok_ = 0;
  int rank_ = 0;
  const HfTokenizer* hf_ = nullptr;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::int64_t in_flight_ = 0;
  std::int64_t free_slots_ = 0;  // after the last step's admissions (under m_)
  bool draining_ = false;
  std::vector<Seq> seqs_;  // by slot (rank 0)
};

void Engine::release(const std::shared_ptr<Job>& job) {
  for (Seq& s : seqs_)
    if (s.job == job) s = Seq{};
}

// The plan of one step: [0 (work) | 1 (quit), P, P x (slot, n, n tokens), B, B x (token, position)].
std::vector<std::int64_t> Engine::plan() {
  std::vector<std::shared_ptr<Job>> admitted;
  {
    std::unique_lock<std::mutex> lk(m_);
    if (stop_requested() != 0 && !draining_) {
      draining_ = true;
      std::cout << "serve_gpt: " << (stop_requested() == SIGINT ? "SIGINT" : StopSignal::name(stop_requested()))
                << ": draining " << in_flight_ << " request(s), then exiting" << std::endl;
    }
    // wait for work while nothing runs
    if (!running())
      cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return !queue_.empty() || stop_requested() != 0; });
    // the sequences of cancelled requests (a client gone) leave the batch
    for (Seq& s : seqs_)
      if (s.job && s.job->cancelled.load()) s = Seq{};
    std::int64_t free = 0;
    for (const Seq& s : seqs_) free += s.job ? 0 : 1;
    while (!queue_.empty()) {
      std::shared_ptr<Job> j = queue_.front();
      if (j->cancelled.load()) {
        queue_.pop_front();
        continue;
      }
      if (j->req.n > free) break;  // first come, first served: it waits for slots
      queue_.pop_front();
      free -= j->req.n;
      admitted.push_back(j);
    }
    free_slots_ = free;
    if (draining_ && queue_.empty() && admitted.empty() && !running() && in_flight_ == 0) return {1};
  }
  std::vector<std::int64_t> p = {0, 0};
  // decode: the running sequences (prefilled in an earlier step), slots [0, B)
  std::int64_t B = 0;
  for (std::int64_t s = 0; s < slots_; ++s)
    if (seqs_[static_cast<size_t>(s)].job && seqs_[static_cast<size_t>(s)].prefilled) B = s + 1;
  std::vector<std::int64_t> decode;
  for (std::int64_t s = 0; s < B; ++s) {
    const Seq& q = seqs_[static_cast<size_t>(s)];
    if (q.job && q.prefilled) {
      const Choice& c = q.job->choices[static_cast<size_t>(q.choice)];
      const std::int64_t pos = static_cast<std::int64_t>(q.job->req.prompt.size() + c.tokens.size()) - 1;
      decode.insert(decode.end(), {c.tokens.back(), pos});
    } else {
      decode.insert(decode.end(), {0, 0});  // an idle slot rides along at position 0
    }
  }
  // prefills: each admitted request's choices into the lowest free slots
  for (const auto& j : admitted)
    for (int c = 0; c < j->req.n; ++c) {
      std::int64_t s = 0;
      while (seqs_[static_cast<size_t>(s)].job) ++s;
      seqs_[static_cast<size_t>(s)] = Seq{j, c, false};
      j->choices[static_cast<size_t>(c)].slot = static_cast<int>(s);
      ++p[1];
      p.push_back(s);
      p.push_back(static_cast<std::int64_t>(j->req.prompt.size()));
      p.insert(p.end(), j->req.prompt.begin(), j->req.prompt.end());
    }
  p.push_back(B);
  p.insert(p.end(), decode.begin(), decode.end());
  return p;
}

void Engine::execute(const std::vector<std::int64_t>& p) {
  // the plan's prefills, then its decode batch; the decode runs first: an idle slot of the batch
  // rides along at position 0, which a prefill of that slot in this step then overwrites
  size_t at = 1;
  const std::int64_t P = p[at++];
  std::vector<std::pair<std::int64_t, std::vector<std::int32_t>>> prefills;
  for (std::int64_t k = 0; k < P; ++k) {
    const std::int64_t slot = p[at++], n = p[at++];
    prefills.push_back(
        {slot, std::vector<std::int32_t>(p.begin() + static_cast<std::ptrdiff_t>(at),
                                         p.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(n)))});
    at += static_cast<size_t>(n);
  }
  const std::int64_t B = p[at++];
  if (B > 0) {
    std::vector<std::int32_t> in(static_cast<size_t>(B));
    std::vector<std::int64_t> pos(static_cast<size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) {
      in[static_cast<size_t>(b)] = static_cast<std::int32_t>(p[at++]);
      pos[static_cast<size_t>(b)] = p[at++];
    }
    const std::vector<float> lg = gen_.decode(in, pos);
    if (rank_ == 0)
      for (std::int64_t b = 0; b < B; ++b) {
        const Seq& q = seqs_[static_cast<size_t>(b)];
        if (q.job && q.prefilled) after_token(b, lg.data() + b * V_);
      }
  }
  for (const auto& [slot, tokens] : prefills) {
    const std::vector<float> lg = gen_.prefill(slot, tokens);
    if (rank_ == 0) {
      seqs_[static_cast<size_t>(slot)].prefilled = true;
      after_token(slot, lg.data());
    }
  }
}

// Length of the longest prefix of s that ends on a whole UTF-8 character.
size_t complete_utf8(const std::string& s) {
  size_t end = s.size(), i = s.size();
  int back = 0;
  while (i > 0 && back < 4) {
    --i;
    ++back;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const int need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (back < need) end = i;  // the last character is cut
    break;
  }
  return end;
}

void Engine::after_token(std::int64_t slot, const float* logits) {
  Seq& q = seqs_[static_cast<size_t>(slot)];
  std::shared_ptr<Job> job = q.job;
  const GenRequest& r = job->req;
  std::unique_lock<std::mutex> lk(job->m);
  Choice& c = job->choices[static_cast<size_t>(q.choice)];
  const std::int64_t step = static_cast<std::int64_t>(c.tokens.size());
  const std::uint64_t key = r.seed * 0x9E3779B97F4A7C15ull ^
                            splitmix64(static_cast<std::uint64_t>(q.choice) * 1000003ull +
                                       static_cast<std::uint64_t>(step));
  const std::int32_t t = sample_token(logits, Vtok_, r.sp, key);
  if (r.top_logprobs >= 0) {
    c.logprobs.push_back(token_logprob(logits, Vtok_, t));
    std::vector<std::pair<std::int32_t, double>> tops;
    if (r.top_logprobs > 0) {
      std::vector<std::int32_t> ids;
      order_by_logit(logits, Vtok_, ids);
      for (int k = 0; k < r.top_logprobs && k < Vtok_; ++k)
        tops.push_back({ids[k], token_logprob(logits, Vtok_, ids[k])});
    }
    c.tops.push_back(std::move(tops));
  }
  c.tokens.push_back(t);
  if (job->t_first == 0) job->t_first = now_s();
  const bool stop_token = std::find(r.stop_ids.begin(), r.stop_ids.end(), t) != r.stop_ids.end();
  std::vector<std::int32_t> body = c.tokens;
  if (stop_token) body.pop_back();
  std::string full = decode(body);
  size_t cut = std::string::npos, hold = 0;
  for (const std::string& s : r.stop) {
    cut = std::min(cut, full.find(s));
    hold = std::max(hold, s.size() - 1);
  }
  if (stop_token || cut != std::string::npos) {
    c.finish = "stop";
  } else if (static_cast<std::int64_t>(c.tokens.size()) >= r.max_tokens ||
             static_cast<std::int64_t>(r.prompt.size() + c.tokens.size()) >= L_) {
    c.finish = "length";
  }
  if (cut != std::string::npos) full.resize(cut);
  if (c.finish.empty()) {  // hold back a cut character and what may start a stop string
    size_t keep = complete_utf8(full);
    keep = keep > hold ? keep - hold : 0;
    full.resize(std::max(keep, std::min(c.text.size(), keep)));
  }
  if (full.size() >= c.text.size()) {
    c.text = std::move(full);
    c.shown = c.finish.empty() ? c.tokens.size() - 1 : c.tokens.size();
  }
  if (!c.finish.empty()) {
    q = Seq{};  // the slot is free from the next step
    bool all = true;
    for (const Choice& x : job->choices) all = all && !x.finish.empty();
    job->done = all;
  }
  job->cv.notify_all();
}

void Engine::run() {
  const Communicator& world = im_.topo.world();
  const int size = world.size();
  for (;;) {
    std::vector<std::int64_t> p;
    if (rank_ == 0) {
      p = plan();
      if (p.size() == 3 && p[0] == 0 && p[1] == 0 && p[2] == 0) continue;  // nothing to run
    }
    if (size > 1) world.broadcast_waiting(p);  // the other ranks wait for a plan without spinning a core
    if (p[0] == 1) return;
    execute(p);
  }
}

// ---------------------------------------------------------------------------------------------
// JSON requests

// Checks `j`'s fields against `known` (the rest is a 400 naming the field).
void only_known(const json& j, const std::set<std::string>& known) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) bad("unknown field '" + it.key() + "'", it.key());
}

double number(const json& j, const char* key, double def, double lo, double hi, const char* range) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number()) bad(std::string("'") + key + "' must be a number", key);
  const double v = j[key].get<double>();
  if (!(v >= lo && v <= hi)) bad(std::string("'") + key + "' must be " + range, key);
  return v;
}

std::int64_t integer(const json& j, const char* key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                     const std::string& range) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number_integer()) bad(std::string("'") + key + "' must be an integer", key);
  const std::int64_t v = j[key].get<std::int64_t>();
  if (v < lo || v > hi) bad(std::string("'") + key + "' must be " + range, key);
  return v;
}

// A request body as JSON (a 400 naming the parse error otherwise).
json parse_body(const std::string& body) {
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    bad(std::string("the body is not valid JSON: ") + e.what());
  }
}

bool boolean(const json& j, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) bad(std::string("'") + key + "' must be true or false", key);
  return j[key].get<bool>();
}

class Api {
 public:
  Api(Engine& engine, const InferenceModel& im, const Options& o) : e_(engine), im_(im), o_(o) {
    name_ = o.model_name.empty() ? "trident-gpt" : o.model_name;
    const std::int32_t eod = im.tokenizer->eod_id();
    if (eod >= 0) stop_ids_.push_back(eod);
    std::string where = o.chat_template;
    if (where.empty() && o.tok.type == "HuggingFaceTokenizer") where = o.tok.model;
    if (!where.empty()) {
      chat_ = std::make_unique<ChatTemplate>(ChatTemplate::from_config(where));
      // the end of an assistant turn: a token of its own where the tokenizer has one, else a stop string
      const std::string eot = chat_->end_of_turn();
      const std::vector<std::int32_t> ids = im.tokenizer->encode(eot);
      if (ids.size() == 1)
        chat_stop_ids_.push_back(ids[0]);
      else
        chat_stop_text_ = eot;
    }
    created_ = static_cast<std::int64_t>(std::time(nullptr));
  }
  const std::string& name() const { return name_; }
  bool has_chat() const { return chat_ != nullptr; }
  const char* chat_name() const { return chat_ ? chat_->name() : "none"; }

  void sampling(const json& j, GenRequest& r, std::int64_t default_max) const {
    if (j.contains("model") && !j["model"].is_null()) {
      if (!j["model"].is_string()) bad("'model' must be a string", "model");
      if (j["model"].get<std::string>() != name_)
        throw HttpError{404,
                        "the model '" + j["model"].get<std::string>() + "' is not served here (this server: '" + name_ +
                            "')",
                        "invalid_request_error", "model"};
    }
    const std::int64_t room = e_.max_len() - static_cast<std::int64_t>(r.prompt.size());
    if (room <= 0)
      bad("the prompt has " + std::to_string(r.prompt.size()) + " tokens; the model's context is " +
              std::to_string(e_.max_len()) + " positions, and at least one must be left to generate",
          j.contains("messages") ? "messages" : "prompt");
    r.max_tokens = integer(j, "max_tokens", std::min(default_max, room), 1, std::numeric_limits<std::int64_t>::max(),
                           ">= 1");
    if (j.contains("max_completion_tokens"))
      r.max_tokens = integer(j, "max_completion_tokens", r.max_tokens, 1, std::numeric_limits<std::int64_t>::max(),
                             ">= 1");
    if (r.max_tokens > room)
      bad("max_tokens is " + std::to_string(r.max_tokens) + " but the prompt's " + std::to_string(r.prompt.size()) +
              " tokens leave " + std::to_string(room) + " of the model's context of " + std::to_string(e_.max_len()),
          "max_tokens");
    const double temperature = number(j, "temperature", 1.0, 0.0, 2.0, "in [0, 2]");
    r.sp.greedy = temperature == 0.0;
    r.sp.temperature = r.sp.greedy ? 1.0 : temperature;
    r.sp.top_p = number(j, "top_p", 1.0, 0.0, 1.0, "in (0, 1]");
    if (r.sp.top_p <= 0) bad("'top_p' must be in (0, 1]", "top_p");
    r.sp.top_k = integer(j, "top_k", 0, 0, std::numeric_limits<std::int64_t>::max(), ">= 0");
    r.n = static_cast<int>(
        integer(j, "n", 1, 1, e_.slots(), "between 1 and the server's batch (" + std::to_string(e_.slots()) + ")"));
    if (j.contains("seed") && !j["seed"].is_null()) {
      if (!j["seed"].is_number_integer()) bad("'seed' must be an integer", "seed");
      r.seed = static_cast<std::uint64_t>(j["seed"].get<std::int64_t>());
    } else {
      static std::mt19937_64 gen{std::random_device{}()};
      static std::mutex m;
      std::lock_guard<std::mutex> lk(m);
      r.seed = gen();
    }
    if (j.contains("stop") && !j["stop"].is_null()) {
      const json& s = j["stop"];
      if (s.is_string()) {
        r.stop.push_back(s.get<std::string>());
      } else if (s.is_array() && s.size() <= 4) {
        for (const json& x : s) {
          if (!x.is_string()) bad("'stop' must be a string or an array of at most 4 strings", "stop");
          r.stop.push_back(x.get<std::string>());
        }
      } else {
        bad("'stop' must be a string or an array of at most 4 strings", "stop");
      }
      for (const std::string& x : r.stop)
        if (x.empty()) bad("a 'stop' string is empty", "stop");
    }
    r.stream = boolean(j, "stream", false);
    if (j.contains("stream_options") && !j["stream_options"].is_null()) {
      const json& so = j["stream_options"];
      if (!so.is_object()) bad("'stream_options' must be an object", "stream_options");
      only_known(so, {"include_usage"});
      if (!r.stream) bad("'stream_options' is only allowed with \"stream\": true", "stream_options");
      r.include_usage = boolean(so, "include_usage", false);
    }
    for (const char* k : {"presence_penalty", "frequency_penalty"})
      if (number(j, k, 0.0, -2.0, 2.0, "in [-2, 2]") != 0.0)
        bad(std::string("'") + k + "' is not supported by this server (only 0)", k);
    r.stop_ids = stop_ids_;
  }

  GenRequest completion(const json& j) const {
    if (!j.is_object()) bad("the body must be a JSON object");
    only_known(j, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "logprobs",
                   "stream", "stream_options", "user", "presence_penalty", "frequency_penalty", "echo"});
    GenRequest r;
    if (!j.contains("prompt")) bad("'prompt' is required", "prompt");
    const json& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = im_.tokenizer->encode(p.get<std::string>());
    } else if (p.is_array() && !p.empty() &&
               std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
      for (const json& x : p) {
        const std::int64_t t = x.get<std::int64_t>();
        if (t < 0 || t >= im_.tokenizer->vocab_size()) bad("a prompt token id is out of the vocabulary", "prompt");
        r.prompt.push_back(static_cast<std::int32_t>(t));
      }
    } else {
      bad("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
    }
    if (r.prompt.empty()) bad("the prompt is empty", "prompt");
    if (boolean(j, "echo", false)) bad("'echo' is not supported by this server", "echo");
    sampling(j, r, 16);
    if (j.contains("logprobs") && !j["logprobs"].is_null())
      r.top_logprobs = static_cast<int>(integer(j, "logprobs", 0, 0, 5, "between 0 and 5"));
    return r;
  }

  GenRequest chat(const json& j) const {
    if (!j.is_object()) bad("the body must be a JSON object");
    only_known(j, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
                   "seed", "n", "logprobs", "top_logprobs", "stream", "stream_options", "user", "presence_penalty",
                   "frequency_penalty"});
    if (!chat_)
      throw HttpError{400,
                      "this server has no chat template: start it with --chat-template (a tokenizer_config.json) or "
                      "with a Hugging Face tokenizer that has one",
                      "invalid_request_error", "messages"};
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
      bad("'messages' must be a non-empty array", "messages");
    std::vector<ChatMessage> messages;
    for (const json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        bad("every message must be an object with string 'role' and 'content'", "messages");
      only_known(m, {"role", "content", "name"});
      ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      cm.content = m["content"].get<std::string>();
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
        bad("unknown message role '" + cm.role + "' (system, user, assistant)", "messages");
      messages.push_back(std::move(cm));
    }
    GenRequest r;
    try {
      r.prompt = im_.tokenizer->encode(chat_->render(messages, true).text);
    } catch (const Error& e) {
      bad(std::string("the chat template refuses these messages: ") + e.what(), "messages");
    }
    sampling(j, r, std::numeric_limits<std::int64_t>::max());
    r.stop_ids.insert(r.stop_ids.end(), chat_stop_ids_.begin(), chat_stop_ids_.end());
    if (!chat_stop_text_.empty()) r.stop.push_back(chat_stop_text_);
    if (boolean(j, "logprobs", false))
      r.top_logprobs = static_cast<int>(integer(j, "top_logprobs", 0, 0, 20, "between 0 and 20"));
    else if (j.contains("top_logprobs") && !j["top_logprobs"].is_null())
      bad("'top_logprobs' needs \"logprobs\": true", "top_logprobs");
    return r;
  }

  // ---- responses ----
  json completion_logprobs(const Choice& c, size_t from, size_t to, size_t text_offset) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    size_t off = text_offset;
    for (size_t i = from; i < to && i < c.logprobs.size(); ++i) {
      const std::string t = e_.token_text(c.tokens[i]);
      tokens.push_back(t);
      lps.push_back(c.logprobs[i]);
      json top = json::object();
      for (const auto& [id, lp] : c.tops[i]) top[e_.token_text(id)] = lp;
      tops.push_back(top);
      offsets.push_back(off);
      off += t.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }
  json chat_logprobs(const Choice& c, size_t from, size_t to) const {
    auto entry = [&](std::int32_t id, double lp) {
      const std::string t = e_.token_text(id);
      json bytes = json::array();
      for (unsigned char b : t) bytes.push_back(static_cast<int>(b));
      return json{{"token", t}, {"logprob", lp}, {"bytes", bytes}};
    };
    json content = json::array();
    for (size_t i = from; i < to && i < c.logprobs.size(); ++i) {
      json e = entry(c.tokens[i], c.logprobs[i]);
      json top = json::array();
      for (const auto& [id, lp] : c.tops[i]) top.push_back(entry(id, lp));
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    return {{"content", content}};
  }
  // Tokens of a finished choice that its response counts: a stop token is not text.
  static size_t counted(const Choice& c, const GenRequest& r) {
    if (!c.tokens.empty() && c.finish == "stop" &&
        std::find(r.stop_ids.begin(), r.stop_ids.end(), c.tokens.back()) != r.stop_ids.end())
      return c.tokens.size() - 1;
    return c.tokens.size();
  }
  json usage(const Job& job) const {
    std::int64_t completion = 0;
    for (const Choice& c : job.choices) completion += static_cast<std::int64_t>(c.tokens.size());
    const std::int64_t prompt = static_cast<std::int64_t>(job.req.prompt.size());
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }
  json full_response(const Job& job, bool is_chat) const {
    json choices = json::array();
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const Choice& c = job.choices[i];
      json ch = {{"index", i}, {"finish_reason", c.finish}};
      const size_t n = counted(c, job.req);
      if (is_chat) {
        ch["message"] = {{"role", "assistant"}, {"content", c.text}};
        ch["logprobs"] = job.req.top_logprobs >= 0 ? chat_logprobs(c, 0, n) : json(nullptr);
      } else {
        ch["text"] = c.text;
        ch["logprobs"] = job.req.top_logprobs >= 0 ? completion_logprobs(c, 0, n, 0) : json(nullptr);
      }
      choices.push_back(ch);
    }
    return {{"id", job.id},
            {"object", is_chat ? "chat.completion" : "text_completion"},
            {"created", static_cast<std::int64_t>(std::time(nullptr))},
            {"model", name_},
            {"choices", choices},
            {"usage", usage(job)}};
  }
  json chunk(const Job& job, bool is_chat, json choices) const {
    return {{"id", job.id},
            {"object", is_chat ? "chat.completion.chunk" : "text_completion"},
            {"created", static_cast<std::int64_t>(std::time(nullptr))},
            {"model", name_},
            {"choices", std::move(choices)}};
  }
  json models() const {
    return {{"object", "list"},
            {"data",
             json::array({{{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "trident"}}})}};
  }

 private:
  Engine& e_;
  const InferenceModel& im_;
  const Options& o_;
  std::string name_;
  std::unique_ptr<ChatTemplate> chat_;
  std::vector<std::int32_t> stop_ids_, chat_stop_ids_;
  std::string chat_stop_text_;
  std::int64_t created_ = 0;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

// The constant-time comparison of an API key: SHA-256 digests compared byte by byte, all of them.
bool same_key(const std::string& a, const std::string& b) {
  const std::string x = sha256_hex(a), y = sha256_hex(b);
  unsigned char diff = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) diff |= static_cast<unsigned char>(x[i] ^ y[i]);
  return diff == 0 && x.size() == y.size();
}

std::atomic<std::int64_t> g_ids{0};

// Serves one generation request: waits for the engine, or streams its tokens as server-sent events.
void generate(Engine& engine, const Api& api, GenRequest r, bool is_chat, httplib::Response& res) {
  auto job = std::make_shared<Job>();
  job->req = std::move(r);
  job->id = (is_chat ? "chatcmpl-" : "cmpl-") + std::to_string(g_ids.fetch_add(1) + 1);
  if (!engine.submit(job)) {
    res.set_header("Retry-After", "1");
    send_json(res, 503,
              error_body(HttpError{503,
                                   engine.draining() ? "the server is shutting down"
                                                     : "the server is at capacity (its queue is full); retry later",
                                   "server_error", ""}));
    return;
  }
  if (!job->req.stream) {
    std::unique_lock<std::mutex> lk(job->m);
    job->cv.wait(lk, [&] { return job->done; });
    send_json(res, 200, api.full_response(*job, is_chat));
    lk.unlock();
    engine.request_finished();
    return;
  }
  struct StreamState {
    std::vector<size_t> text_sent, tokens_sent;
    std::vector<bool> finish_sent;
    bool role_sent = false, finished = false;
  };
  auto st = std::make_shared<StreamState>();
  st->text_sent.assign(job->choices.size(), 0);
  st->tokens_sent.assign(job->choices.size(), 0);
  st->finish_sent.assign(job->choices.size(), false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, st, is_chat, &api](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lk(job->m);
        auto news = [&] {
          if (job->done) return true;
          for (size_t i = 0; i < job->choices.size(); ++i)
            if (job->choices[i].text.size() > st->text_sent[i] || !job->choices[i].finish.empty()) {
              if (!st->finish_sent[i]) return true;
            }
          return false;
        };
        while (!news()) {
          job->cv.wait_for(lk, std::chrono::milliseconds(200));
          if (!sink.is_writable()) return false;  // the client is gone
        }
        std::string out;
        auto event = [&](const json& j) { out += "data: " + dump(j) + "\n\n"; };
        if (is_chat && !st->role_sent) {
          json chs = json::array();
          for (size_t i = 0; i < job->choices.size(); ++i)
            chs.push_back({{"index", i},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
          event(api.chunk(*job, true, chs));
          st->role_sent = true;
        }
        for (size_t i = 0; i < job->choices.size(); ++i) {
          const Choice& c = job->choices[i];
          if (st->finish_sent[i]) continue;
          const bool fin = !c.finish.empty();
          const size_t upto = fin ? Api::counted(c, job->req) : c.shown;
          if (c.text.size() > st->text_sent[i] || fin) {
            const std::string delta = c.text.substr(st->text_sent[i]);
            json ch = {{"index", i}, {"finish_reason", fin ? json(c.finish) : json(nullptr)}};
            json lp = nullptr;
            if (job->req.top_logprobs >= 0)
              lp = is_chat ? api.chat_logprobs(c, st->tokens_sent[i], upto)
                           : api.completion_logprobs(c, st->tokens_sent[i], upto, st->text_sent[i]);
            if (is_chat)
              ch["delta"] = delta.empty() && fin ? json::object() : json{{"content", delta}};
            else
              ch["text"] = delta;
            ch["logprobs"] = lp;
            event(api.chunk(*job, is_chat, json::array({ch})));
            st->text_sent[i] = c.text.size();
            st->tokens_sent[i] = std::max(st->tokens_sent[i], upto);
            if (fin) st->finish_sent[i] = true;
          }
        }
        if (job->done) {
          if (job->req.include_usage) {
            json u = api.chunk(*job, is_chat, json::array());
            u["usage"] = api.usage(*job);
            event(u);
          }
          out += "data: [DONE]\n\n";
        }
        const bool done = job->done;
        lk.unlock();
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (done) {
          st->finished = true;
          sink.done();
        }
        return true;
      },
      [job, st, &engine](bool success) {
        if (!success || !st->finished) job->cancelled.store(true);  // the engine drops its sequences
        engine.request_finished();
      });
}

int run(int argc, char** argv) {
  Options o;
  po::options_description desc(
      "serve_gpt: an OpenAI-compatible completion server for a GPT-family checkpoint (run with mpiexec -n tp)\n"
      "usage: [mpiexec -n TP] serve_gpt --checkpoint DIR (--vocab-file F --merge-file F | --tokenizer-type T "
      "--tokenizer-model M) [--port 8000]\n"
      "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, PUT /api");
  desc.add_options()("help", "this text")("checkpoint", po::value(&o.checkpoint),
                                          "checkpoint: a save directory (its latest), an iter_* directory or a file")(
      "vocab-file", po::value(&o.tok.vocab),
      "GPT-2 encoder.json")("merge-file", po::value(&o.tok.merges),
                            "GPT-2 vocab.bpe")("tokenizer-type",
                                               po::value(&o.tok.type)->default_value("GPT2BPETokenizer"),
                                               "GPT2BPETokenizer, HuggingFaceTokenizer or SentencePieceTokenizer")(
      "tokenizer-model", po::value(&o.tok.model), "HuggingFaceTokenizer: tokenizer.json (or its directory)")(
      "chat-template", po::value(&o.chat_template),
      "a tokenizer_config.json (or its directory) whose chat_template renders /v1/chat/completions (default: the "
      "Hugging Face tokenizer's)")("host", po::value(&o.host)->default_value("127.0.0.1"),
                                   "address to listen on (0.0.0.0: every interface)")(
      "port", po::value(&o.port)->default_value(8000),
      "port (0: any free one, printed at start)")("api-key", po::value(&o.api_key),
                                                  "require 'Authorization: Bearer KEY' on every request")(
      "model-name", po::value(&o.model_name), "the model's id in requests and /v1/models (default trident-gpt)")(
      "max-batch", po::value(&o.max_batch)->default_value(8), "sequences decoded together (key-value-cache slots)")(
      "kv-cache-mib", po::value(&o.kv_cache_mib)->default_value(0),
      "memory budget of the key-value cache per rank in MiB: fewer slots when --max-batch does not fit (0: none)")(
      "max-queue", po::value(&o.max_queue)->default_value(64),
      "requests waiting for a slot; beyond them a 503 with Retry-After")(
      "max-length", po::value(&o.max_length)->default_value(0), "positions per sequence (0: the model's context)")(
      "max-body-bytes", po::value(&o.max_body)->default_value(1 << 20),
      "largest request body (413 beyond)")("timeout", po::value(&o.timeout_s)->default_value(30),
                                           "seconds a client may take to send or receive")(
      "http-threads", po::value(&o.threads)->default_value(0),
      "HTTP connections served at once (0: --max-batch + --max-queue + 16, so that a request beyond the queue is "
      "answered with a 503 rather than left unread)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("serve_gpt: ") + e.what() + " (see --help)");
  }
  const int rank = mpi_job::world_rank();
  if (vm.count("help")) {
    if (rank == 0) std::cout << desc;
    return 0;
  }
  TRIDENT_REQUIRE(!o.checkpoint.empty(), "serve_gpt: --checkpoint is required");
  const bool gpt2 = o.tok.type == "GPT2BPETokenizer";
  TRIDENT_REQUIRE(!gpt2 || (!o.tok.vocab.empty() && !o.tok.merges.empty()),
                  "serve_gpt: --vocab-file and --merge-file are required (GPT-2's BPE; or --tokenizer-type and "
                  "--tokenizer-model)");
  TRIDENT_REQUIRE(gpt2 || !o.tok.model.empty(), "serve_gpt: " << o.tok.type << " needs --tokenizer-model");
  TRIDENT_REQUIRE(o.max_batch >= 1 && o.max_queue >= 0 && o.threads >= 0 && o.max_body >= 1024 && o.timeout_s > 0,
                  "serve_gpt: --max-batch must be >= 1, --max-queue and --http-threads >= 0, --max-body-bytes >= "
                  "1024, --timeout > 0");
  if (o.threads == 0) o.threads = static_cast<int>(std::min<std::int64_t>(o.max_batch + o.max_queue + 16, 4096));
  TRIDENT_REQUIRE(o.port >= 0 && o.port <= 65535, "serve_gpt: --port must be in [0, 65535]");
  // SIGTERM or SIGINT drains the server (rank 0); the other ranks follow rank 0's plans until it quits
  StopSignal stop;
  g_stop = &stop;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  InferenceModel im("serve_gpt", o.checkpoint, o.tok);
  const std::int64_t L = o.max_length > 0 ? std::min(o.max_length, im.cfg.max_positions) : im.cfg.max_positions;
  // the cache: every layer's keys and values of this rank's key/value heads, per slot
  const double slot_bytes = static_cast<double>(im.cfg.total_layers()) * static_cast<double>(L) * 2.0 *
                            static_cast<double>(im.cfg.kv_width()) / static_cast<double>(mpi_job::world_size()) * 4.0;
  std::int64_t slots = o.max_batch;
  if (o.kv_cache_mib > 0)
    slots = std::min<std::int64_t>(slots, static_cast<std::int64_t>(o.kv_cache_mib * 1048576.0 / slot_bytes));
  TRIDENT_REQUIRE(slots >= 1, "serve_gpt: --kv-cache-mib " << o.kv_cache_mib << " holds no sequence of " << L
                                                           << " positions (" << slot_bytes / 1048576.0 << " MiB each)");
  GptGenerator gen(*im.model, slots, L, im.tokenizer->eod_id());
  stop.arm();  // from here SIGTERM drains instead of ending the process
  Engine engine(im, gen, slots, L, o.max_queue);
  if (rank != 0) {
    engine.run();
    return 0;
  }
  Api api(engine, im, o);
  httplib::Server svr;
  svr.new_task_queue = [n = static_cast<size_t>(o.threads)] { return new httplib::ThreadPool(n); };
  svr.set_payload_max_length(static_cast<size_t>(o.max_body));
  svr.set_read_timeout(static_cast<time_t>(o.timeout_s), 0);
  svr.set_write_timeout(static_cast<time_t>(o.timeout_s), 0);
  svr.set_keep_alive_timeout(5);
  const std::string bearer = o.api_key.empty() ? "" : "Bearer " + o.api_key;
  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!o.api_key.empty() && !same_key(req.get_header_value("Authorization"), bearer)) {
      send_json(res, 401,
                error_body(HttpError{401, "a valid API key is required (Authorization: Bearer KEY)",
                                     "authentication_error", ""}));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // errors without a body of their own (404, 413 for a body over the limit, 400 for bad HTTP)
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 413   ? "the request body is over the server's limit (--max-body-bytes)"
                             : res.status == 404 ? "no such endpoint"
                                                 : "the request could not be served";
    send_json(res, res.status, error_body(HttpError{res.status, what, "invalid_request_error", ""}));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body(HttpError{500, what, "server_error", ""}));
  });
  auto endpoint = [&](bool is_chat) {
    return [&, is_chat](const httplib::Request& req, httplib::Response& res) {
      try {
        const json j = parse_body(req.body);
        GenRequest r = is_chat ? api.chat(j) : api.completion(j);
        generate(engine, api, std::move(r), is_chat, res);
      } catch (const HttpError& e) {
        send_json(res, e.status, error_body(e));
      }
    };
  };
  svr.Post("/v1/completions", endpoint(false));
  svr.Post("/v1/chat/completions", endpoint(true));
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) { send_json(res, 200, api.models()); });
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    send_json(res, engine.draining() ? 503 : 200, {{"status", engine.draining() ? "draining" : "ok"}});
  });
  // Megatron's text-generation server: {"prompts": [...], "tokens_to_generate": N, ...} ->
  // {"text": [prompt + continuation], "segments": [[token strings]], "logprobs": [[...]]}
  svr.Put("/api", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      const json j = parse_body(req.body);
      if (!j.is_object()) bad("the body must be a JSON object");
      only_known(j, {"prompts", "tokens_to_generate", "temperature", "top_k", "top_p", "logprobs", "random_seed"});
      if (!j.contains("prompts") || !j["prompts"].is_array() || j["prompts"].empty())
        bad("'prompts' must be a non-empty list of strings", "prompts");
      const std::int64_t n = integer(j, "tokens_to_generate", 64, 1, std::numeric_limits<std::int64_t>::max(), ">= 1");
      const bool lp = boolean(j, "logprobs", false);
      std::vector<std::shared_ptr<Job>> jobs;
      json text = json::array(), segments = json::array(), logprobs = json::array();
      for (const json& p : j["prompts"]) {
        if (!p.is_string()) bad("'prompts' must be a non-empty list of strings", "prompts");
        json one = {{"prompt", p}, {"max_tokens", n}};
        if (j.contains("temperature")) one["temperature"] = j["temperature"];
        if (j.contains("top_k")) one["top_k"] = j["top_k"];
        if (j.contains("top_p")) one["top_p"] = j["top_p"];
        if (j.contains("random_seed")) one["seed"] = j["random_seed"];
        if (lp) one["logprobs"] = 0;
        GenRequest r = api.completion(one);
        auto job = std::make_shared<Job>();
        job->req = std::move(r);
        job->id = "api-" + std::to_string(g_ids.fetch_add(1) + 1);
        if (!engine.submit(job)) {
          for (auto& x : jobs) x->cancelled.store(true);
          for (size_t k = 0; k < jobs.size(); ++k) engine.request_finished();
          res.set_header("Retry-After", "1");
          send_json(res, 503, error_body(HttpError{503, "the server is at capacity; retry later", "server_error", ""}));
          return;
        }
        jobs.push_back(job);
      }
      for (size_t k = 0; k < jobs.size(); ++k) {
        Job& job = *jobs[k];
        std::unique_lock<std::mutex> lk(job.m);
        job.cv.wait(lk, [&] { return job.done; });
        const Choice& c = job.choices[0];
        const std::string prompt = j["prompts"][k].get<std::string>();
        text.push_back(prompt + c.text);
        json seg = json::array();
        for (std::int32_t t : job.req.prompt) seg.push_back(engine.token_text(t));
        for (size_t i = 0; i < Api::counted(c, job.req); ++i) seg.push_back(engine.token_text(c.tokens[i]));
        segments.push_back(seg);
        if (lp)
          logprobs.push_back(
              json(std::vector<double>(c.logprobs.begin(),
                                       c.logprobs.begin() + static_cast<std::ptrdiff_t>(Api::counted(c, job.req)))));
        lk.unlock();
        engine.request_finished();
      }
      json out = {{"text", text}, {"segments", segments}};
      if (lp) out["logprobs"] = logprobs;
      send_json(res, 200, out);
    } catch (const HttpError& e) {
      send_json(res, e.status, error_body(e));
    }
  });

  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    TRIDENT_REQUIRE(port > 0, "serve_gpt: cannot listen on " << o.host << " (any port)");
  } else {
    TRIDENT_REQUIRE(svr.bind_to_port(o.host, port),
                    "serve_gpt: cannot listen on " << o.host << ":" << port << " (in use, or not allowed)");
  }
  std::cout << "serve_gpt: checkpoint " << im.file << " (iteration " << im.state.iteration << "), tp "
            << mpi_job::world_size() << ", " << slots << " slots of " << L << " positions (key-value cache "
            << gen.cache_bytes() / 1048576.0 << " MiB on rank 0), chat template " << api.chat_name() << "\n"
            << "serve_gpt: model '" << api.name() << "' listening on http://" << o.host << ":" << port << std::endl;
  std::thread http([&] { svr.listen_after_bind(); });
  engine.run();  // until a signal has drained the requests
  svr.stop();
  http.join();
  std::cout << "serve_gpt: stopped" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return trident::run_app(argc, argv, run); }
