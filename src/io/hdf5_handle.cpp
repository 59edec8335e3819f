// The HDF5 helpers of hdf5_handle.hpp. Attributes are written as scalars, replacing one of the
// same name: strings fixed-length and NUL-padded, integers int64 LE, doubles f64 LE (the root
// attributes of docs/DESIGN.md "Token shards" and "Checkpoints"). Readers check the attribute's
// class, throw Error::all naming it and `where`, and accept variable-length strings too (h5py
// writes those).
#include "io/hdf5_handle.hpp"

#include <atomic>
#include <exception>

#include "common/error.hpp"

namespace trident {

namespace {
thread_local H5CollectiveScope* innermost_scope = nullptr;
std::atomic<bool> handles_left_open{false};
}  // namespace

H5CollectiveScope::H5CollectiveScope() : exceptions_at_entry_(std::uncaught_exceptions()), outer_(innermost_scope) {
  innermost_scope = this;
}
H5CollectiveScope::~H5CollectiveScope() { innermost_scope = outer_; }
bool H5CollectiveScope::left_open() { return handles_left_open.load(); }
void H5CollectiveScope::note_left_open() { handles_left_open.store(true); }
bool H5CollectiveScope::unwinding() {
  return innermost_scope && std::uncaught_exceptions() > innermost_scope->exceptions_at_entry_;
}

H5QuietErrors::H5QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
H5QuietErrors::~H5QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

void h5_write_attr(hid_t obj, const std::string& name, const std::string& value) {
  H5Handle type = h5_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type, value.empty() ? 1 : value.size());
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5Handle space = h5_space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Handle attr = h5_attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(attr.valid(), "cannot create HDF5 attribute '" << name << "'");
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  H5Awrite(attr, type, padded.data());
}

void h5_write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  H5Handle space = h5_space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Handle attr = h5_attr(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(attr.valid(), "cannot create HDF5 attribute '" << name << "'");
  H5Awrite(attr, H5T_NATIVE_INT64, &value);
}

void h5_write_attr(hid_t obj, const std::string& name, double value) {
  H5Handle space = h5_space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Handle attr = h5_attr(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(attr.valid(), "cannot create HDF5 attribute '" << name << "'");
  H5Awrite(attr, H5T_NATIVE_DOUBLE, &value);
}

bool h5_has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

static H5Handle open_attr(hid_t obj, const std::string& name, const std::string& where) {
  TRIDENT_REQUIRE(h5_has_attr(obj, name), where << ": missing attribute '" << name << "'");
  return h5_attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
}

std::string h5_read_attr_string(hid_t obj, const std::string& name, const std::string& where) {
  H5Handle attr = open_attr(obj, name, where);
  H5Handle type = h5_type(H5Aget_type(attr));
  TRIDENT_REQUIRE(H5Tget_class(type) == H5T_STRING, where << ": attribute '" << name << "' is not a string");
  if (H5Tis_variable_str(type) > 0) {
    char* s = nullptr;
    H5Handle mem = h5_type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));  // h5py writes UTF-8 variable-length strings
    TRIDENT_REQUIRE(H5Aread(attr, mem, &s) >= 0, where << ": cannot read string attribute '" << name << "'");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(type);
  std::string out(n, '\0');
  H5Aread(attr, type, out.data());
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

std::int64_t h5_read_attr_int(hid_t obj, const std::string& name, const std::string& where) {
  H5Handle attr = open_attr(obj, name, where);
  H5Handle type = h5_type(H5Aget_type(attr));
  TRIDENT_REQUIRE(H5Tget_class(type) == H5T_INTEGER, where << ": attribute '" << name << "' is not an integer");
  std::int64_t v = 0;
  H5Aread(attr, H5T_NATIVE_INT64, &v);
  return v;
}

double h5_read_attr_double(hid_t obj, const std::string& name, const std::string& where) {
  H5Handle attr = open_attr(obj, name, where);
  H5Handle type = h5_type(H5Aget_type(attr));
  auto cls = H5Tget_class(type);
  TRIDENT_REQUIRE(cls == H5T_FLOAT || cls == H5T_INTEGER, where << ": attribute '" << name << "' is not a number");
  double v = 0;
  H5Aread(attr, H5T_NATIVE_DOUBLE, &v);
  return v;
}

std::vector<hsize_t> h5_dims(hid_t dataset) {
  H5Handle space = h5_space(H5Dget_space(dataset));
  int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);  // (rank): one extent per dimension
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

void h5_make_parents(hid_t loc, const std::string& path) {
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos) {
    std::string g = path.substr(0, pos);
    if (H5Lexists(loc, g.c_str(), H5P_DEFAULT) <= 0) {
      H5Handle grp = h5_group(H5Gcreate2(loc, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      TRIDENT_REQUIRE(grp.valid(), "cannot create HDF5 group '" << g << "'");
    }
  }
}

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  std::string v = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#if defined(H5_HAVE_PARALLEL)
  v += " (parallel)";
#endif
  return v;
}

}  // namespace trident
