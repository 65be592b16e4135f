#include "agent/guest_init.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "net/addressing.h"

namespace space::agent {

namespace {

void mountOne(const char* source, const char* target, const char* type, unsigned long flags, const char* data) {
  mkdir(target, 0755);
  if (mount(source, target, type, flags, data) != 0 && errno != EBUSY) {
    fprintf(stderr, "space-agent: mount %s on %s: %s\n", type, target, strerror(errno));
  }
}

void bringUpLoopback() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) fprintf(stderr, "space-agent: lo up: %s\n", strerror(errno));
  }
  close(s);
}

bool setIfAddress(int s, const char* ifname, unsigned long request, const char* address) {
  ifreq ifr{};
  strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  auto* in = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  in->sin_family = AF_INET;
  if (inet_pton(AF_INET, address, &in->sin_addr) != 1) return false;
  return ioctl(s, request, &ifr) == 0;
}

void writeSmallFile(const char* path, const std::string& text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    fprintf(stderr, "space-agent: write %s: %s\n", path, strerror(errno));
  }
  close(fd);
}

// The NIC, when the VM has one (net/addressing.h): every guest has the same address, gateway
// and resolver, set here at boot, so a template's clones carry it and need no renumbering.
// Host-side policy is what protects: root here may change all of this and gains nothing.
void bringUpNetwork() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {  // no NIC: a VM without network
    close(s);
    return;
  }
  // The slot carries no IPv6: without it, no program waits on an address family that
  // cannot work.
  writeSmallFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1\n");
  writeSmallFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1\n");
  bool ok =
      setIfAddress(s, "eth0", SIOCSIFADDR, net::kGuestIp) && setIfAddress(s, "eth0", SIOCSIFNETMASK, "255.255.255.252");
  ifr.ifr_mtu = net::kMtu;
  ok = ok && ioctl(s, SIOCSIFMTU, &ifr) == 0;
  ifr.ifr_flags = 0;
  ok = ok && ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  rtentry route{};
  auto* dst = reinterpret_cast<sockaddr_in*>(&route.rt_dst);
  auto* gateway = reinterpret_cast<sockaddr_in*>(&route.rt_gateway);
  auto* mask = reinterpret_cast<sockaddr_in*>(&route.rt_genmask);
  dst->sin_family = gateway->sin_family = mask->sin_family = AF_INET;
  inet_pton(AF_INET, net::kGatewayIp, &gateway->sin_addr);
  route.rt_flags = RTF_UP | RTF_GATEWAY;
  char dev[] = "eth0";
  route.rt_dev = dev;
  ok = ok && (ioctl(s, SIOCADDRT, &route) == 0 || errno == EEXIST);
  if (!ok) fprintf(stderr, "space-agent: eth0: %s\n", strerror(errno));
  close(s);
  // The gateway answers DNS on its address (every query to port 53 reaches it anyway).
  writeSmallFile("/etc/resolv.conf", std::string("nameserver ") + net::kGatewayIp + "\noptions timeout:2 attempts:2\n");
}

}  // namespace

void initGuest() {
  umask(022);
  // The agent holds fds for every process it runs (pipes, PTYs) and every watch; the kernel's
  // default of 1024 for PID 1 would run out long before its process limit.
  rlimit files{65536, 65536};
  if (setrlimit(RLIMIT_NOFILE, &files) != 0) fprintf(stderr, "space-agent: RLIMIT_NOFILE: %s\n", strerror(errno));
  mountOne("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mountOne("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mountOne("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  mountOne("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666");
  mountOne("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mountOne("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  mountOne("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  symlink("/proc/self/fd", "/dev/fd");
  symlink("/proc/self/fd/0", "/dev/stdin");
  symlink("/proc/self/fd/1", "/dev/stdout");
  symlink("/proc/self/fd/2", "/dev/stderr");
  std::ifstream in("/etc/hostname");
  std::string name;
  if (std::getline(in, name) && !name.empty()) sethostname(name.data(), name.size());
  bringUpLoopback();
  bringUpNetwork();
  setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
}

std::string findVirtioPort(const std::string& name) {
  DIR* dir = opendir("/sys/class/virtio-ports");
  if (dir == nullptr) return {};
  std::string found;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
    std::string port_name;
    if (std::getline(in, port_name) && port_name == name) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  closedir(dir);
  return found;
}

void shutdownGuest() {
  // Every user process descends from PID 1, so "no children left" means all are gone.
  auto reapAll = [] {
    while (true) {
      pid_t r = waitpid(-1, nullptr, WNOHANG);
      if (r > 0) continue;
      return r < 0 && errno == ECHILD;
    }
  };
  kill(-1, SIGTERM);
  for (int i = 0; i < 100 && !reapAll(); ++i) usleep(10000);  // up to 1 s to exit on their own
  kill(-1, SIGKILL);
  for (int i = 0; i < 100 && !reapAll(); ++i) usleep(10000);
  sync();
  mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY, nullptr);
  sync();
  // microvm has no ACPI power-off; a reset makes QEMU (-no-reboot) exit.
  reboot(RB_AUTOBOOT);
  _exit(1);
}

std::string applyIdentity(const std::string& hostname, int64_t unix_time_ms, const std::string& entropy) {
  std::string failed;
  if (!hostname.empty() && ::sethostname(hostname.data(), hostname.size()) != 0) {
    failed += std::string("sethostname: ") + strerror(errno) + "; ";
  }
  if (unix_time_ms > 0) {
    timespec ts{static_cast<time_t>(unix_time_ms / 1000), static_cast<long>(unix_time_ms % 1000) * 1000000};
    if (::clock_settime(CLOCK_REALTIME, &ts) != 0) failed += std::string("clock_settime: ") + strerror(errno) + "; ";
  }
  if (!entropy.empty()) {
    int fd = ::open("/dev/urandom", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      failed += std::string("open /dev/urandom: ") + strerror(errno) + "; ";
    } else {
      // RNDADDENTROPY credits the bytes (the host's CSPRNG output); RNDRESEEDCRNG makes the
      // CRNG use them now rather than at its next scheduled reseed.
      std::vector<char> req(sizeof(rand_pool_info) + entropy.size());
      auto* info = reinterpret_cast<rand_pool_info*>(req.data());
      info->entropy_count = static_cast<int>(entropy.size() * 8);
      info->buf_size = static_cast<int>(entropy.size());
      memcpy(info->buf, entropy.data(), entropy.size());
      if (::ioctl(fd, RNDADDENTROPY, info) != 0) failed += std::string("RNDADDENTROPY: ") + strerror(errno) + "; ";
      if (::ioctl(fd, RNDRESEEDCRNG) != 0) failed += std::string("RNDRESEEDCRNG: ") + strerror(errno) + "; ";
      ::close(fd);
    }
  }
  return failed;
}

}  // namespace space::agent
