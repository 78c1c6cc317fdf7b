#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace m3 {

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

struct SafeTensors::Mapping {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base && size) munmap(const_cast<uint8_t*>(base), size);
  }
};

std::string normalise_tensor_name(const std::string& raw) {
  static const std::pair<const char*, const char*> kRewrites[] = {
      {"language_model.model.", "model."},
      {"language_model.lm_head.", "lm_head."},
      {"model.language_model.", "model."},
      {"language_model.", "model."},
  };
  for (const auto& [from, to] : kRewrites) {
    size_t n = std::strlen(from);
    if (raw.compare(0, n, from) == 0) return std::string(to) + raw.substr(n);
  }
  return raw;
}

SafeTensors::SafeTensors() = default;
SafeTensors::SafeTensors(SafeTensors&&) noexcept = default;
SafeTensors& SafeTensors::operator=(SafeTensors&&) noexcept = default;
SafeTensors::~SafeTensors() = default;

namespace {

std::unique_ptr<SafeTensors::Mapping> map_file(const std::string& path);

void parse_one_file(const std::string& path, const uint8_t* base, size_t size,
                    std::map<std::string, TensorRef>& out, const std::set<std::string>* only) {
  M3_CHECK(size >= 8, "{}: file too small to be safetensors ({} bytes)", path, size);
  uint64_t hlen = 0;
  std::memcpy(&hlen, base, 8);
  M3_CHECK(hlen <= size - 8, "{}: header length {} exceeds file size {}", path, hlen, size);
  M3_CHECK(hlen <= (100u << 20), "{}: header length {} is implausibly large", path, hlen);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + hlen));
  } catch (const json::parse_error& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  M3_CHECK(header.is_object(), "{}: header must be a JSON object", path);
  const uint8_t* data = base + 8 + hlen;
  size_t data_size = size - 8 - hlen;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& e = it.value();
    const std::string& raw = it.key();
    M3_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
             "{}: tensor '{}' entry lacks dtype/shape/data_offsets", path, raw);
    M3_CHECK(e["dtype"].is_string(), "{}: tensor '{}' dtype must be a string", path, raw);
    TensorRef t;
    t.name = normalise_tensor_name(raw);
    t.file = path;
    std::string dt = e["dtype"].get<std::string>();
    if (dt == "F8_E4M3FN") dt = "F8_E4M3";
    M3_CHECK(dtype_from_name(dt, &t.dtype), "{}: tensor '{}' has unsupported dtype '{}'", path, raw, dt);
    M3_CHECK(e["shape"].is_array(), "{}: tensor '{}' shape must be a list", path, raw);
    for (const auto& d : e["shape"]) {
      M3_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "{}: tensor '{}' has a bad dimension", path, raw);
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    M3_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             "{}: tensor '{}' data_offsets must be two non-negative integers", path, raw);
    size_t b = off[0].get<size_t>(), en = off[1].get<size_t>();
    M3_CHECK(b <= en && en <= data_size, "{}: tensor '{}' data [{}, {}) lies outside the {}-byte data section", path,
             raw, b, en, data_size);
    // Overflow-safe element count against the byte range.
    __int128 numel = 1;
    for (auto d : t.shape) {
      numel *= d;
      M3_CHECK(numel < (__int128(1) << 62), "{}: tensor '{}' shape is too large", path, raw);
    }
    M3_CHECK(__int128(en - b) == numel * __int128(dtype_size(t.dtype)),
             "{}: tensor '{}' has {} bytes but shape × dtype needs {}", path, raw, en - b,
             int64_t(numel * dtype_size(t.dtype)));
    t.data = data + b;
    t.nbytes = en - b;
    ranges.emplace_back(b, en);
    if (only && !only->count(raw)) continue;
    M3_CHECK(!out.count(t.name), "{}: tensor '{}' appears twice (after name normalisation: '{}')", path, raw, t.name);
    out.emplace(t.name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    M3_CHECK(ranges[i].first >= ranges[i - 1].second || ranges[i].first == ranges[i].second,
             "{}: tensor data ranges overlap", path);
}

std::unique_ptr<SafeTensors::Mapping> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  M3_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat {}", path);
  }
  auto m = std::make_unique<SafeTensors::Mapping>();
  m->path = path;
  m->size = size_t(st.st_size);
  if (m->size > 0) {
    void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    M3_CHECK(p != MAP_FAILED, "cannot mmap {}: {}", path, std::strerror(errno));
    m->base = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

SafeTensors SafeTensors::open(const std::string& path) {
  SafeTensors st;
  st.root_ = path;
  std::vector<std::string> files;
  std::map<std::string, std::set<std::string>> per_file;  // sharded: which raw names each file must provide
  if (fs::is_directory(path)) {
    fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(index)) {
      json j;
      try {
        j = json::parse(read_text(index.string()));
      } catch (const json::parse_error& e) {
        fail("{}: invalid JSON: {}", index.string(), e.what());
      }
      M3_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "{}: missing 'weight_map'",
               index.string());
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        M3_CHECK(it.value().is_string(), "{}: weight_map['{}'] must be a file name", index.string(), it.key());
        std::string f = it.value().get<std::string>();
        M3_CHECK(f.find('/') == std::string::npos && f.find("..") == std::string::npos,
                 "{}: weight_map['{}'] names a file outside the model directory", index.string(), it.key());
        per_file[(fs::path(path) / f).string()].insert(it.key());
      }
      for (auto& [f, _] : per_file) files.push_back(f);
    } else if (fs::exists(fs::path(path) / "model.safetensors")) {
      files.push_back((fs::path(path) / "model.safetensors").string());
    } else {
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".safetensors" && e.path().filename() != "golden.safetensors")
          files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
    }
    M3_CHECK(!files.empty(), "{}: no .safetensors files found", path);
  } else {
    M3_CHECK(fs::exists(path), "{}: no such file or directory", path);
    files.push_back(path);
  }
  for (const auto& f : files) {
    auto m = map_file(f);
    auto it = per_file.find(f);
    size_t before = st.tensors_.size();
    parse_one_file(f, m->base, m->size, st.tensors_, it == per_file.end() ? nullptr : &it->second);
    if (it != per_file.end())
      M3_CHECK(st.tensors_.size() - before == it->second.size(),
               "{}: the index lists {} tensors for this file but it holds {} of them", f, it->second.size(),
               st.tensors_.size() - before);
    st.maps_.push_back(std::move(m));
  }
  return st;
}

bool SafeTensors::has(const std::string& name) const { return tensors_.count(name) > 0; }

const TensorRef& SafeTensors::get(const std::string& name) const {
  auto it = tensors_.find(name);
  M3_CHECK(it != tensors_.end(), "missing tensor '{}' in {}", name, root_);
  return it->second;
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  for (const auto& [k, _] : tensors_) out.push_back(k);
  return out;
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

std::vector<float> SafeTensors::read_f32(const std::string& name, const std::vector<int64_t>& expected) const {
  const TensorRef& t = get(name);
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back(), rows = t.numel() / std::max<int64_t>(cols, 1);
  return read_f32_block(name, expected, 0, rows, 0, cols);
}

std::vector<float> SafeTensors::read_f32_block(const std::string& name, const std::vector<int64_t>& expected,
                                               int64_t row0, int64_t row1, int64_t col0, int64_t col1) const {
  const TensorRef& t = get(name);
  M3_CHECK(t.shape == expected, "tensor '{}' in {} has shape {} but the config implies {}", name, t.file,
           shape_str(t.shape), shape_str(expected));
  // Viewed as [rows, cols] (cols = last dim; a 1-D tensor is one row).
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back(), rows = t.numel() / std::max<int64_t>(cols, 1);
  M3_CHECK(0 <= row0 && row0 <= row1 && row1 <= rows && 0 <= col0 && col0 <= col1 && col1 <= cols,
           "tensor '{}' in {}: block rows [{}, {}) cols [{}, {}) outside [{}, {}]", name, t.file, row0, row1, col0,
           col1, rows, cols);
  const int64_t bw = col1 - col0;
  std::vector<float> out(static_cast<size_t>((row1 - row0) * bw));
  auto each = [&](auto&& convert) {  // convert(flat source index) → float
    for (int64_t r = row0; r < row1; ++r)
      for (int64_t c = col0; c < col1; ++c) out[size_t((r - row0) * bw + (c - col0))] = convert(r * cols + c);
  };
  const uint8_t* p = t.data;
  const int64_t n_block = (row1 - row0) * bw;
  switch (t.dtype) {
    case DType::F32:
      for (int64_t r = row0; r < row1; ++r)
        std::memcpy(out.data() + (r - row0) * bw, p + 4 * (r * cols + col0), size_t(bw) * 4);
      bytes_read_ += n_block * 4;
      break;
    case DType::F64:
      each([&](int64_t i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        return float(d);
      });
      bytes_read_ += n_block * 8;
      break;
    case DType::BF16:
    case DType::F16: {
      const bool bf = t.dtype == DType::BF16;
      each([&](int64_t i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        return bf ? bf16_to_f32(h) : f16_to_f32(h);
      });
      bytes_read_ += n_block * 2;
      break;
    }
    case DType::F8_E4M3: {
      // MXFP8: one UE8M0 scale per 32 consecutive elements of each row (last dim).
      std::string scale_name = name + "_scale_inv";
      M3_CHECK(has(scale_name), "tensor '{}' in {} is FP8 but its block scale '{}' is missing", name, t.file,
               scale_name);
      const TensorRef& s = get(scale_name);
      M3_CHECK(!t.shape.empty(), "FP8 tensor '{}' must have at least one dimension", name);
      int64_t scols = (cols + 31) / 32;
      std::vector<int64_t> sshape = t.shape;
      sshape.back() = scols;
      M3_CHECK(s.dtype == DType::U8 || s.dtype == DType::I8 || s.dtype == DType::F8_E4M3,
               "scale '{}' in {} must be one byte per block (UE8M0), got {}", scale_name, s.file, dtype_name(s.dtype));
      M3_CHECK(s.shape == sshape, "scale '{}' in {} has shape {} but [.., {}/32] = {} is needed", scale_name, s.file,
               shape_str(s.shape), cols, shape_str(sshape));
      M3_CHECK(col0 % 32 == 0, "FP8 tensor '{}': a column slice must start on a 32-column scale block, not {}", name,
               col0);
      for (int64_t r = row0; r < row1; ++r)
        for (int64_t c = col0; c < col1; ++c)
          out[size_t((r - row0) * bw + (c - col0))] = e4m3_to_f32(p[r * cols + c]) * ue8m0_to_f32(s.data[r * scols + c / 32]);
      bytes_read_ += n_block + (row1 - row0) * ((col1 - col0 + 31) / 32);
      break;
    }
    default:
      fail("tensor '{}' in {} has dtype {}, which is not a floating-point weight type", name, t.file,
           dtype_name(t.dtype));
  }
  return out;
}

void SafeTensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  M3_CHECK(size_t(n) * dtype_size(dtype) == bytes.size(), "writer: tensor '{}' byte size mismatch", name);
  entries_[name] = Entry{dtype, std::move(shape), std::move(bytes)};
}

void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  add(name, DType::F32, std::move(shape), std::move(bytes));
}

void SafeTensorsWriter::write(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t off = 0;
  for (const auto& [name, e] : entries_) {
    header[name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::ofstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot write {}", path);
  uint64_t hlen = h.size();
  f.write(reinterpret_cast<const char*>(&hlen), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, e] : entries_) f.write(reinterpret_cast<const char*>(e.bytes.data()), std::streamsize(e.bytes.size()));
  M3_CHECK(f.good(), "error writing {}", path);
}

}  // namespace m3
