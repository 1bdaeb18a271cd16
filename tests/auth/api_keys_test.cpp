#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "auth/api_keys.hpp"

using namespace exa;
using namespace exa::auth;
using Catch::Matchers::Contains;

TEST_CASE("a new key is shown once, and the set keeps only its hash", "[auth]") {
  key_set keys;
  auto k = keys.add("acme", false, 1700000000);
  REQUIRE(k);
  CHECK(k->rfind("exa-", 0) == 0);
  CHECK(k->size() == 4 + 43);
  const std::string text = keys.serialize();
  CHECK(text.find(*k) == std::string::npos);             // never the key itself
  CHECK(text.find(k->substr(4, 12)) == std::string::npos);
  CHECK_THAT(text, Contains("sha256=" + hash_key(*k)));
  const key_entry* e = keys.find(*k);
  REQUIRE(e);
  CHECK(e->tenant == "acme");
  CHECK_FALSE(e->admin);
  CHECK(e->id == hash_key(*k).substr(0, 12));
  CHECK(keys.find("exa-not-a-key") == nullptr);
  CHECK(keys.find("") == nullptr);
  CHECK(keys.find(k->substr(0, k->size() - 1)) == nullptr);
}

TEST_CASE("keys are random and survive a round trip through the file format", "[auth]") {
  key_set keys;
  std::set<std::string> made;
  for (int i = 0; i < 50; ++i) made.insert(*keys.add(i % 2 ? "t1" : "ops", i == 0, 1700000000 + i));
  CHECK(made.size() == 50);
  auto back = key_set::parse(keys.serialize());
  REQUIRE(back);
  REQUIRE(back->entries().size() == 50);
  for (const auto& k : made) CHECK(back->find(k) != nullptr);
  CHECK(back->find(*made.begin())->created_unix_s >= 1700000000);
  CHECK(back->serialize() == keys.serialize());
}

TEST_CASE("a malformed keys file is refused with its line and the reason", "[auth]") {
  const std::string h = hash_key("exa-x");
  const std::string good = "key " + h.substr(0, 12) + " sha256=" + h + " tenant=acme admin=0 created=1\n";
  REQUIRE(key_set::parse("# comment\n\n" + good));
  struct bad {
    std::string text, says;
  };
  for (const auto& b : std::vector<bad>{
           {"kee x\n", "line 1: expected 'key <id>"},
           {"key " + h.substr(0, 12) + " sha256=XYZ tenant=a admin=0 created=1\n", "line 1: sha256= must be 64"},
           {"key 000000000000 sha256=" + h + " tenant=a admin=0 created=1\n", "the id must be the first 12"},
           {"key " + h.substr(0, 12) + " sha256=" + h + " tenant=a/b admin=0 created=1\n", "may use only"},
           {"key " + h.substr(0, 12) + " sha256=" + h + " tenant=a admin=yes created=1\n", "admin= must be 0 or 1"},
           {"key " + h.substr(0, 12) + " sha256=" + h + " tenant=a admin=0 created=-5\n", "created= must be"},
           {good + good, "line 2: key " + h.substr(0, 12) + " appears twice"},
       }) {
    auto r = key_set::parse(b.text);
    INFO(b.text);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Contains(b.says));
  }
}

TEST_CASE("a key is revoked by its id or an unambiguous prefix", "[auth]") {
  key_set keys;
  const std::string a = *keys.add("acme", false, 1), b = *keys.add("acme", true, 2);
  const std::string id_a = keys.find(a)->id;
  CHECK(keys.revoke("xyz").error().code == errc::invalid_argument);
  CHECK(keys.revoke("abcdef").error().code == errc::not_found);
  auto gone = keys.revoke(id_a.substr(0, 8));
  REQUIRE(gone);
  CHECK(gone->id == id_a);
  CHECK(keys.find(a) == nullptr);
  CHECK(keys.find(b) != nullptr);
}

TEST_CASE("the keys file is written whole, private, and reloaded by the store", "[auth]") {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/auth-store";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/keys";
  CHECK(key_store::open(path).error().code == errc::io_error);  // no file: never open by accident
  key_set keys;
  const std::string first = *keys.add("acme", false, 1);
  REQUIRE(save_keys(path, keys));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto store = key_store::open(path);
  REQUIRE(store);
  auto before = (*store)->current();
  CHECK(before->find(first));
  const std::string second = *keys.add("beta", false, 2);
  REQUIRE(save_keys(path, keys));
  CHECK_FALSE(before->find(second));  // a snapshot does not change under its reader
  REQUIRE((*store)->reload() == std::size_t{2});
  CHECK((*store)->current()->find(second));
  // A broken file keeps the keys already loaded.
  std::ofstream(path) << "garbage\n";
  auto bad = (*store)->reload();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Contains(path + ": line 1"));
  CHECK((*store)->current()->find(second));
}

TEST_CASE("tenant names", "[auth]") {
  CHECK(check_tenant("acme-prod_1.eu"));
  CHECK_FALSE(check_tenant(""));
  CHECK_FALSE(check_tenant(std::string(65, 'a')));
  CHECK_FALSE(check_tenant("a b"));
}
