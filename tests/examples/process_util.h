// process_util.h — running the example trainers as processes from a
// GoogleTest binary: a shell command with its output and exit code, the
// mpirun prefix the tests use, the test's temporary directory.
#ifndef ZS_TESTS_EXAMPLES_PROCESS_UTIL_H_
#define ZS_TESTS_EXAMPLES_PROCESS_UTIL_H_

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace zstest {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs a shell command, capturing stdout and stderr.
inline RunResult Shell(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Trainer flags (space-separated, no quoting) with each flag kept once, at
// its last value: the trainers refuse a repeated flag, and the tests build
// a run from shared defaults plus overrides ("--batch 12 ... --batch 16").
// A flag's value is the next token unless that is a flag itself.
inline std::string LastWins(const std::string& flags) {
  std::vector<std::pair<std::string, std::string>> out;  // flag, " value"
  std::istringstream in(flags);
  std::vector<std::string> tok;
  for (std::string t; in >> t;) tok.push_back(t);
  for (size_t i = 0; i < tok.size(); i++) {
    std::string value;
    if (i + 1 < tok.size() && tok[i + 1].rfind("--", 0) != 0) value = " " + tok[++i];
    bool replaced = false;
    for (auto& [f, v] : out)
      if (tok[i - (value.empty() ? 0 : 1)] == f) {
        v = value;
        replaced = true;
      }
    if (!replaced) out.emplace_back(tok[i - (value.empty() ? 0 : 1)], value);
  }
  std::string r;
  for (const auto& [f, v] : out) r += " " + f + v;
  return r;
}

inline std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

// mpirun with `ranks` ranks oversubscribing the cores, `threads` OpenMP
// threads each, killed after `timeout_s` seconds.
inline std::string Mpirun(int ranks, int threads = 1, int timeout_s = 300) {
  return "timeout " + std::to_string(timeout_s) +
         " mpirun --allow-run-as-root --oversubscribe --bind-to none "
         "--mca mpi_yield_when_idle 1 --mca btl self,vader -x OMP_NUM_THREADS=" +
         std::to_string(threads) + " -np " + std::to_string(ranks) + " ";
}

}  // namespace zstest

#endif  // ZS_TESTS_EXAMPLES_PROCESS_UTIL_H_
