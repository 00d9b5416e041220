// A parser with a planted defect: it mishandles inputs that end early after "seed" or whose
// fifth byte was changed. The driver's self-test passes only when fuzzing reports it.
#include "../fuzz_target.hpp"

EMBCACHE_FUZZ_TARGET(planted_defect) {
  if (size < 4 || data[0] != 's') return;
  EMBCACHE_FUZZ_CHECK(size >= 8 && data[4] == ':');
}
