// Minimal "--name=value" / "--name value" command-line flags for the services' small tools.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace musku {

class Flags {
 public:
  Flags(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument: " + a);
      a = a.substr(2);
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a] = argv[++i];
      } else {
        values_[a] = "true";
      }
    }
  }
  std::string Str(const std::string& name, const std::string& def) {
    used_.push_back(name);
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  std::int64_t Int(const std::string& name, std::int64_t def) {
    const std::string s = Str(name, "");
    if (s.empty()) return def;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0') throw std::invalid_argument("--" + name + ": not an integer: " + s);
    return v;
  }
  double Double(const std::string& name, double def) {
    const std::string s = Str(name, "");
    if (s.empty()) return def;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') throw std::invalid_argument("--" + name + ": not a number: " + s);
    return v;
  }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  // Throws on any flag that no Str/Int/Double call asked for (catches typos).
  void CheckAllUsed() const {
    for (const auto& kv : values_) {
      bool found = false;
      for (const auto& u : used_) found = found || u == kv.first;
      if (!found) throw std::invalid_argument("unknown flag --" + kv.first);
    }
  }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> used_;
};

inline std::vector<std::string> SplitList(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace musku
