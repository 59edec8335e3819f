// RAII ownership of HDF5 identifiers (H5Handle: one hid_t closed by its matching H5?close, made by
// h5_file, h5_group, ...), a guard that silences HDF5's own error printing, and the helpers that
// token shards, checkpoints and debug dumps share: scalar attributes (string, int64, double),
// dataset dimensions, intermediate groups and the HDF5 library version. The files they build are
// described in docs/DESIGN.md "Token shards" and "Checkpoints".
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trident {

// Marks code in which every rank makes the same HDF5 calls on a file opened with MPI-IO, where
// creating and closing objects and the file are collective. An error met there by some ranks only
// (a write that fails on a full disk on one rank) must not close their handles on the way out:
// the close would wait in a collective that the other ranks, already in the next one, never join,
// and the job would hang instead of ending with the error (app_driver's abort). While an
// exception raised inside the innermost scope unwinds it, H5Handle's destructor leaves its
// identifier open, and the job then ends without closing it: closing at MPI_Finalize would flush
// the file again, which on a full disk fails on some ranks and not others (the same hang), so
// run_app ends such a job through MPI_Abort once the error is printed.
class H5CollectiveScope {
 public:
  H5CollectiveScope();
  ~H5CollectiveScope();
  H5CollectiveScope(const H5CollectiveScope&) = delete;
  H5CollectiveScope& operator=(const H5CollectiveScope&) = delete;
  // An exception raised inside the innermost scope of this thread is unwinding it.
  static bool unwinding();
  // Some handle was left open by such an exception (the process must not finalize HDF5).
  static bool left_open();
  static void note_left_open();

 private:
  int exceptions_at_entry_;
  H5CollectiveScope* outer_;
};

// Owns one hid_t and closes it with the matching H5?close (left open when an exception unwinds
// an H5CollectiveScope).
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~H5Handle() {
    if (id_ >= 0 && H5CollectiveScope::unwinding()) {  // see H5CollectiveScope
      H5CollectiveScope::note_left_open();
      id_ = -1;
    }
    reset();
  }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  // Gives up ownership without closing (the caller closes and checks the result).
  hid_t release() { return std::exchange(id_, -1); }
  bool valid() const { return id_ >= 0; }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline H5Handle h5_file(hid_t id) { return H5Handle(id, H5Fclose); }
inline H5Handle h5_group(hid_t id) { return H5Handle(id, H5Gclose); }
inline H5Handle h5_dataset(hid_t id) { return H5Handle(id, H5Dclose); }
inline H5Handle h5_space(hid_t id) { return H5Handle(id, H5Sclose); }
inline H5Handle h5_type(hid_t id) { return H5Handle(id, H5Tclose); }
inline H5Handle h5_plist(hid_t id) { return H5Handle(id, H5Pclose); }
inline H5Handle h5_attr(hid_t id) { return H5Handle(id, H5Aclose); }

// Silences HDF5's automatic error stack printing for the lifetime of the object (we report
// our own errors with the file and object name).
class H5QuietErrors {
 public:
  H5QuietErrors();
  ~H5QuietErrors();

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// Attribute helpers on an object (file root or group). Readers throw Error::all naming the
// attribute and `where` when it is missing or of the wrong kind.
void h5_write_attr(hid_t obj, const std::string& name, const std::string& value);
void h5_write_attr(hid_t obj, const std::string& name, std::int64_t value);
void h5_write_attr(hid_t obj, const std::string& name, double value);
bool h5_has_attr(hid_t obj, const std::string& name);
std::string h5_read_attr_string(hid_t obj, const std::string& name, const std::string& where);
std::int64_t h5_read_attr_int(hid_t obj, const std::string& name, const std::string& where);
double h5_read_attr_double(hid_t obj, const std::string& name, const std::string& where);

// Dimensions of a dataset's dataspace.
std::vector<hsize_t> h5_dims(hid_t dataset);

// Creates intermediate groups of `path` ("a/b/c" creates a and a/b) below loc.
void h5_make_parents(hid_t loc, const std::string& path);

// "1.10.8 (parallel)": the HDF5 library loaded at run time.
std::string hdf5_library_version();

}  // namespace trident
