#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/trust_store.h"
#include "common/fs.h"

namespace space::agent {
namespace {

const std::string kPem = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIQ\n-----END CERTIFICATE-----\n";
const std::string kOtherPem = "-----BEGIN CERTIFICATE-----\nMIIBtDCCAVqgAwIBAgIR\n-----END CERTIFICATE-----\n";

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CredentialCaTrust, TheBundleKeepsItsCertificatesAndHoldsOneBlockOfOurs) {
  const std::string system = "-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n";
  std::string once = bundleWithCredentialCa(system, kPem);
  EXPECT_EQ(once.rfind(system, 0), 0u);
  EXPECT_NE(once.find(kPem), std::string::npos);
  // Installed again (a resume, a new rule) and with another CA (a branch's child): one block.
  std::string twice = bundleWithCredentialCa(bundleWithCredentialCa(once, kPem), kOtherPem);
  EXPECT_EQ(twice.rfind(system, 0), 0u);
  EXPECT_EQ(twice.find(kPem), std::string::npos);
  EXPECT_EQ(twice.find("BEGIN SPACE"), twice.rfind("BEGIN SPACE"));
  EXPECT_NE(twice.find(kOtherPem), std::string::npos);
  // A bundle without a final newline still ends up with whole lines.
  EXPECT_NE(bundleWithCredentialCa("x", kPem).find("x\n# BEGIN"), std::string::npos);
}

TEST(CredentialCaTrust, OnlyOnePemCertificateIsAccepted) {
  EXPECT_EQ(checkCredentialCaPem(kPem), "");
  EXPECT_NE(checkCredentialCaPem(""), "");
  EXPECT_NE(checkCredentialCaPem(kPem + kOtherPem), "");
  EXPECT_NE(checkCredentialCaPem("-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n"), "");
  EXPECT_NE(checkCredentialCaPem("-----BEGIN CERTIFICATE-----\n$(reboot)\n-----END CERTIFICATE-----\n"), "");
  EXPECT_NE(
      checkCredentialCaPem("-----BEGIN CERTIFICATE-----\n" + std::string(9000, 'A') + "\n-----END CERTIFICATE-----\n"),
      "");
}

TEST(CredentialCaTrust, InstallWritesTheBundleAndTheCaFile) {
  auto dir = TempDir::create("/tmp", "trust");
  ASSERT_TRUE(dir.ok());
  const std::string root = dir->path();
  std::filesystem::create_directories(root + "/etc/ssl/certs");
  std::ofstream(root + kSystemBundle) << "-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n";
  ASSERT_EQ(installCredentialCa(kPem, root), "");
  ASSERT_EQ(installCredentialCa(kOtherPem, root), "");
  EXPECT_EQ(read(root + kCredentialCaFile), kOtherPem);
  std::string bundle = read(root + kSystemBundle);
  EXPECT_NE(bundle.find("SYSTEM"), std::string::npos);
  EXPECT_NE(bundle.find(kOtherPem), std::string::npos);
  EXPECT_EQ(bundle.find(kPem), std::string::npos);
  EXPECT_EQ(std::filesystem::status(root + kSystemBundle).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0644));
  // No bundle at all: one is made holding the CA.
  auto bare = TempDir::create("/tmp", "trust-bare");
  ASSERT_TRUE(bare.ok());
  ASSERT_EQ(installCredentialCa(kPem, bare->path()), "");
  EXPECT_NE(read(bare->path() + kSystemBundle).find(kPem), std::string::npos);
  EXPECT_NE(installCredentialCa("junk", bare->path()), "");
  EXPECT_EQ(credentialCaEnv().at("NODE_EXTRA_CA_CERTS"), kCredentialCaFile);
}

}  // namespace
}  // namespace space::agent
