// A program outside the embcache tree that links the trainer component of the install tree.
#include <cstdio>
#include <embcache/trainer/trainer.hpp>
#include <embcache/version.hpp>

int main() {
  const auto tables = embcache::default_trainer_tables();
  if (tables.size() != 2) return 1;
  std::printf("consumer_trainer ok: tables %s %s (embcache %s)\n", tables[0].name.c_str(),
              tables[1].name.c_str(), embcache::version_string);
  return 0;
}
