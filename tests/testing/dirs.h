// dirs.h — directory checks the tests share: how many entries a directory
// holds (swap files and directories left behind are counted by it).
#ifndef ZS_TESTS_TESTING_DIRS_H_
#define ZS_TESTS_TESTING_DIRS_H_

#include <dirent.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zstest {

// Entries of `dir` other than . and .. (SIZE_MAX if it cannot be read, so
// that a missing directory never passes for an empty one).
inline size_t DirEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return SIZE_MAX;
  size_t n = 0;
  while (struct dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

}  // namespace zstest

#endif  // ZS_TESTS_TESTING_DIRS_H_
