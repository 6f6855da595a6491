// The GEMM plan table and its cache file: a signature line, then one line per
// shape, "m n k ta tb tc bm bn bk tm tn warp_w lean_loop splits workers us" (later lines
// win). Failing to read or write the file only costs re-tuning. C stdio, not
// iostreams: formatting numbers through an ostream crashed in libstdc++'s
// locale code on the H100 machine's toolchain (GCC 13), inside this module.
#include "gemm_tuning.hpp"

#include <cstdio>
#include <filesystem>
#include <memory>

namespace pwt {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

namespace {

void write_plan(std::FILE* f, const GemmShape& s, const GemmPlan& p) {
  std::fprintf(f, "%u %u %u %d %d %d %u %u %u %u %u %u %u %u %u %.9g\n", s.m, s.n, s.k, int(s.ta), int(s.tb), int(s.tc),
               p.t.bm, p.t.bn, p.t.bk, p.t.tm, p.t.tn, p.t.warp_w, p.t.lean_loop, p.splits, p.workers, p.us);
}

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;
File open_file(const std::string& path, const char* mode) { return File(std::fopen(path.c_str(), mode), &std::fclose); }

// One line without its newline; false at the end of the file.
bool read_line(std::FILE* f, std::string& line) {
  line.clear();
  int ch;
  while ((ch = std::fgetc(f)) != EOF && ch != '\n') line.push_back(char(ch));
  return ch != EOF || !line.empty();
}

}  // namespace

void GemmTuning::configure(bool enabled, const std::string& cache_dir, const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = enabled;
  signature_ = signature;
  file_current_ = false;
  path_.clear();
  if (cache_dir.empty()) return;
  char name[64];
  std::snprintf(name, sizeof name, "gemm-plans-%016llx.txt", static_cast<unsigned long long>(fnv1a(signature)));
  path_ = (std::filesystem::path(cache_dir) / name).string();
  File in = open_file(path_, "r");
  std::string line;
  if (!in || !read_line(in.get(), line) || line != signature) return;
  file_current_ = true;
  while (read_line(in.get(), line)) {
    GemmShape s;
    GemmPlan p;
    int ta = 0, tb = 0, tc = 0;
    // A line cut short by a process that died while appending does not parse.
    if (std::sscanf(line.c_str(), "%u %u %u %d %d %d %u %u %u %u %u %u %u %u %u %lf", &s.m, &s.n, &s.k, &ta, &tb, &tc,
                    &p.t.bm, &p.t.bn, &p.t.bk, &p.t.tm, &p.t.tn, &p.t.warp_w, &p.t.lean_loop, &p.splits, &p.workers,
                    &p.us) != 16)
      continue;
    s.ta = ta != 0;
    s.tb = tb != 0;
    s.tc = tc != 0;
    if (p.t.bm && p.t.bn && p.t.bk && p.t.tm && p.t.tn && p.splits) plans_[s] = p;
  }
}

bool GemmTuning::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return enabled_;
}

std::string GemmTuning::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

std::optional<GemmPlan> GemmTuning::find(const GemmShape& s) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(s);
  if (it == plans_.end()) return std::nullopt;
  return it->second;
}

void GemmTuning::add(const GemmShape& s, const GemmPlan& p) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_[s] = p;
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (file_current_) {
    if (File f = open_file(path_, "a")) write_plan(f.get(), s, p);
    return;
  }
  // First write under this signature: the whole table, replacing a stale file.
  File out = open_file(path_, "w");
  if (!out) return;
  std::fprintf(out.get(), "%s\n", signature_.c_str());
  for (const auto& [shape, plan] : plans_) write_plan(out.get(), shape, plan);
  file_current_ = !std::ferror(out.get());
}

std::vector<std::pair<GemmShape, GemmPlan>> GemmTuning::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {plans_.begin(), plans_.end()};
}

}  // namespace pwt
