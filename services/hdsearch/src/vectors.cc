#include "vectors.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace musku::hdsearch {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File Open(const std::string& path, const char* mode) {
  File f(std::fopen(path.c_str(), mode));
  if (!f) throw DataError(path + ": " + std::strerror(errno));
  return f;
}

}  // namespace

VecHeader ReadVecHeader(const std::string& path) {
  File f = Open(path, "rb");
  unsigned char buf[kVecHeaderBytes];
  if (std::fread(buf, 1, sizeof buf, f.get()) != sizeof buf) {
    throw DataError(path + ": truncated header (not a musku vector file)");
  }
  if (std::memcmp(buf, kVecMagic, 8) != 0) throw DataError(path + ": bad magic (not a musku vector file)");
  VecHeader h;
  std::uint32_t dtype = 0;
  std::memcpy(&h.rows, buf + 8, 8);
  std::memcpy(&h.dim, buf + 16, 4);
  std::memcpy(&dtype, buf + 20, 4);
  if (dtype != 0) throw DataError(path + ": unsupported dtype " + std::to_string(dtype));
  if (h.dim == 0 || h.dim > (1u << 20)) throw DataError(path + ": bad dimension " + std::to_string(h.dim));
  if (h.rows == 0 || h.rows > (1ull << 32)) throw DataError(path + ": bad row count " + std::to_string(h.rows));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": " + std::strerror(errno));
  const unsigned long long want = kVecHeaderBytes + h.rows * h.dim * 4ull;
  if (static_cast<unsigned long long>(st.st_size) != want) {
    throw DataError(path + ": size " + std::to_string(st.st_size) + " bytes, header says " +
                    std::to_string(want) + " (truncated or corrupt)");
  }
  return h;
}

std::vector<float> ReadVecRows(const std::string& path, const VecHeader& h, std::uint64_t begin,
                               std::uint64_t end) {
  if (begin > end || end > h.rows) throw DataError(path + ": row range out of bounds");
  const std::size_t count = static_cast<std::size_t>((end - begin) * h.dim);
  std::vector<float> out(count);
  if (count == 0) return out;
  File f = Open(path, "rb");
  if (std::fseek(f.get(), static_cast<long>(kVecHeaderBytes + begin * h.dim * 4ull), SEEK_SET) != 0 ||
      std::fread(out.data(), sizeof(float), count, f.get()) != count) {
    throw DataError(path + ": short read (truncated)");
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) {
      throw DataError(path + ": non-finite value at row " + std::to_string(begin + i / h.dim));
    }
  }
  return out;
}

void WriteVecFile(const std::string& path, const std::vector<float>& data, std::uint32_t dim) {
  if (dim == 0 || data.empty() || data.size() % dim != 0) {
    throw DataError("WriteVecFile: empty, or size not a multiple of dim");
  }
  File f = Open(path, "wb");
  unsigned char buf[kVecHeaderBytes] = {};
  std::memcpy(buf, kVecMagic, 8);
  const std::uint64_t rows = data.size() / dim;
  std::memcpy(buf + 8, &rows, 8);
  std::memcpy(buf + 16, &dim, 4);
  if (std::fwrite(buf, 1, sizeof buf, f.get()) != sizeof buf ||
      std::fwrite(data.data(), sizeof(float), data.size(), f.get()) != data.size()) {
    throw DataError(path + ": write failed");
  }
}

// 8-wide float vectors: two SSE registers on the baseline, one ymm register in the AVX2 clone.
typedef float V8 __attribute__((vector_size(32)));

__attribute__((target_clones("avx2", "default")))
float SquaredL2(const float* a, const float* b, std::size_t dim) noexcept {
  V8 acc0 = {0, 0, 0, 0, 0, 0, 0, 0};
  V8 acc1 = acc0;
  std::size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    V8 x0, y0, x1, y1;
    std::memcpy(&x0, a + i, 32);
    std::memcpy(&y0, b + i, 32);
    std::memcpy(&x1, a + i + 8, 32);
    std::memcpy(&y1, b + i + 8, 32);
    const V8 d0 = x0 - y0;
    const V8 d1 = x1 - y1;
    acc0 += d0 * d0;
    acc1 += d1 * d1;
  }
  acc0 += acc1;
  float s = 0;
  for (int j = 0; j < 8; ++j) s += acc0[j];
  for (; i < dim; ++i) {
    const float d = a[i] - b[i];
    s += d * d;
  }
  return s;
}

__attribute__((target_clones("avx2", "default")))
float Dot(const float* a, const float* b, std::size_t dim) noexcept {
  V8 acc0 = {0, 0, 0, 0, 0, 0, 0, 0};
  V8 acc1 = acc0;
  std::size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    V8 x0, y0, x1, y1;
    std::memcpy(&x0, a + i, 32);
    std::memcpy(&y0, b + i, 32);
    std::memcpy(&x1, a + i + 8, 32);
    std::memcpy(&y1, b + i + 8, 32);
    acc0 += x0 * y0;
    acc1 += x1 * y1;
  }
  acc0 += acc1;
  float s = 0;
  for (int j = 0; j < 8; ++j) s += acc0[j];
  for (; i < dim; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace musku::hdsearch
