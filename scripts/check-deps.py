#!/usr/bin/env python3
"""Checks that scripts/install-deps.sh installs everything SPACE uses from the system.

A fresh Debian 12 machine has only what install-deps.sh puts there. A file the build reads, or a
program a script, test or benchmark runs, that comes from a package the list does not reach works
on a developer's machine (someone installed it by hand) and fails on a new one. This check runs
after the build in `make test` and finds such uses on the machine that has them:

  files     headers from ninja's deps log, CMake and pkg-config files CMake read, libraries
            the link steps name and the shared libraries the built programs load;
  programs  names the project's shell scripts and C++ string literals run (every word that is a
            program on PATH: qemu-img, mkfs.ext4, debootstrap, jq, ...).

Each must belong to a listed package, to a package in their dependency closure
(`apt-cache depends --recurse --installed`), or to Debian's essential/required base, which every
Debian install has. A failure names the file or program, the package that owns it (`dpkg -S`)
and the line to add to install-deps.sh.

Usage: scripts/check-deps.py --build build [--build build-asan] [--packages FILE] [--file PATH]...
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Words that are programs on PATH but that the project does not run: only named in messages or
# used as plain words. Each with its reason, so the list stays honest.
NOT_RUN = {
    "sudo": "named in install-deps.sh's message to non-root users",
    "apt-get": "run by install-deps.sh itself, before anything could install it (apt is required)",
    "clang-format": "`make format` is a developer's tool, not part of build, run or test",
    "git": "`make format` lists files with it; build, run and test do not need it",
    "file": "a URI scheme in build-rootfs.sh's awk, and a QMP driver name in vm.cc",
}

# Where the project runs programs from: shell scripts and the Makefile (every word), and C++
# sources (string literals only).
SHELL_SOURCES = ["images", "bench", "scripts", "Makefile", ".ci/run", "tests/e2b/run.sh", "tests/ui/run.sh"]
CPP_SOURCES = ["src", "tests", "bench"]


def run(cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def listed_packages(packages_file):
    if packages_file:
        with open(packages_file) as f:
            text = f.read()
    else:
        text = run([os.path.join(ROOT, "scripts/install-deps.sh"), "--list"]).stdout
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def closure(packages):
    """Installed packages reachable from `packages` through Depends and Pre-Depends."""
    if not packages:
        return set()
    out = run(["apt-cache", "depends", "--recurse", "--installed", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages]).stdout
    reached = set()
    for line in out.splitlines():
        if line and not line[0].isspace() and not line.startswith("<"):
            reached.add(line.strip().split(":")[0])
    return reached


def base_packages():
    """Essential and required packages: present on every Debian system, listed or not."""
    out = run(["dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Priority}\t${db:Status-Status}\n"]).stdout
    base = []
    for line in out.splitlines():
        name, essential, priority, status = (line.split("\t") + ["", "", ""])[:4]
        if status == "installed" and (essential == "yes" or priority == "required"):
            base.append(name)
    return base


def canonical(path):
    """The /usr form of a path: /lib, /bin, /sbin are links into /usr on merged-/usr systems."""
    for short in ("/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/"):
        if path.startswith(short) and os.path.islink(short.rstrip("/")):
            return "/usr" + path
    return os.path.normpath(path)


def owned_files(packages):
    """Canonical paths of every file the given installed packages ship (dpkg's file lists)."""
    files = set()
    info = "/var/lib/dpkg/info"
    for pkg in packages:
        for name in (f"{pkg}.list", f"{pkg}:amd64.list"):
            path = os.path.join(info, name)
            if os.path.exists(path):
                with open(path) as f:
                    files.update(canonical(line.rstrip("\n")) for line in f)
    return files


def owner(path):
    """The package that ships `path` (dpkg -S), trying the forms dpkg may have recorded."""
    tries = [path, canonical(path), os.path.realpath(path)]
    if path.startswith("/usr/"):
        tries.append(path[4:])  # recorded under /lib or /bin before the /usr merge
    for t in dict.fromkeys(tries):
        r = run(["dpkg", "-S", t], check=False)
        if r.returncode == 0:
            return r.stdout.split(":")[0].split(",")[0].strip()
    return None


def build_files(build_dir):
    """Files under /usr that building in `build_dir` read or linked."""
    files = set()
    deps = run(["ninja", "-C", build_dir, "-t", "deps"]).stdout
    for line in deps.splitlines():
        p = line.strip()
        if p.startswith("/usr/"):
            files.add(p)
    # build.ninja and its rules: the programs the build runs (compiler, archiver, linker) and
    # the files its steps name.
    ninja = ""
    for name in ("build.ninja", "CMakeFiles/rules.ninja"):
        path = os.path.join(build_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                ninja += f.read() + "\n"
    # The re-run rule lists every CMake file the configure step read (package config files).
    # Link lines name static libraries and -l flags.
    for token in re.findall(r"(?<![\w/.-])(/usr/[^\s$:|]+)", ninja):
        if os.path.isfile(token):
            files.add(token)
    for lib in set(re.findall(r"(?<=\s)-l([\w+.-]+)", ninja)):
        for suffix in (".so", ".a"):
            found = run(["g++", f"-print-file-name=lib{lib}{suffix}"]).stdout.strip()
            if os.path.isabs(found):
                files.add(found)
                break
    cache = os.path.join(build_dir, "CMakeCache.txt")
    with open(cache) as f:
        for line in f:
            # Libraries and headers CMake found. Programs it merely probed (llvm-ar, ld.lld next to
            # clang) are not used unless a rule names them, which the scan above sees.
            m = re.match(r"[^#/][^:]*:(?:FILEPATH|PATH)=(/usr/\S+)$", line.strip())
            if m and os.path.isfile(m.group(1)) and not (os.access(m.group(1), os.X_OK) and
                                                        not re.search(r"\.so(\.|$)", m.group(1))):
                files.add(m.group(1))
            m = re.match(r"(\w+)_MODULE_NAME:INTERNAL=(\S+)$", line.strip())
            if m:  # pkg-config modules: their .pc files
                pc = run(["pkg-config", "--path", m.group(2)], check=False).stdout.strip()
                if pc:
                    files.add(pc)
    bin_dir = os.path.join(build_dir, "bin")
    for name in sorted(os.listdir(bin_dir)) if os.path.isdir(bin_dir) else []:
        path = os.path.join(bin_dir, name)
        ldd = run(["ldd", path], check=False).stdout
        for m in re.finditer(r"=>\s*(/\S+)", ldd):
            files.add(m.group(1))
    return files


def source_files(entries, suffixes=None):
    for entry in entries:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for dirpath, _, names in os.walk(path):
            for n in names:
                if suffixes is None or n.endswith(suffixes):
                    yield os.path.join(dirpath, n)


WORD = re.compile(r"^[a-z][a-z0-9_.+-]*[a-z0-9]$")
# Words before a command that take it as their argument.
PREFIXES = {"if", "then", "do", "else", "elif", "while", "until", "!", "exec", "time", "command",
            "xargs", "setsid", "nice", "ionice", "env", "in_tree", "chroot"}
SEPARATORS = re.compile(r"\$\(|`|&&|\|\||[;|(){}]")


def shell_commands(line):
    """Words in command position on one line of shell (or a Makefile recipe)."""
    code = re.sub(r"(^|\s)#.*$", "", line)
    code = code.replace("'", " ").replace('"', " ")  # bash -c '...' bodies are commands too
    for segment in SEPARATORS.split(code):
        words = segment.split()
        while words:
            w = words[0]
            if w in PREFIXES or "=" in w or w.startswith("-"):
                words = words[1:]
            elif w == "timeout" and len(words) > 1:
                words = [x for x in words[2:] if not x.startswith("-")] if not words[1].startswith("-") else words[1:]
            elif w == "run_step":  # run_step ARTIFACT STEP LOG CMD...: steps are quoted phrases
                break
            else:
                break
        if words and WORD.match(words[0]):
            yield words[0]


def program_words():
    """Programs the project's scripts run, and argv[0]s of its C++ sources."""
    words = {}
    for path in source_files(SHELL_SOURCES):
        if path.endswith((".cc", ".h", ".md", ".txt", ".config", ".py")) or "/kernel/" in path:
            continue
        with open(path, errors="replace") as f:
            for n, line in enumerate(f, 1):
                if line.lstrip().startswith("run_step "):  # its step name is a phrase: skip to CMD
                    m = re.match(r'\s*run_step\s+\S+\s+"[^"]*"\s+\S+\s+(.*)', line)
                    line = m.group(1) if m else ""
                for w in shell_commands(line):
                    words.setdefault(w, f"{os.path.relpath(path, ROOT)}:{n}")
    # C++: a literal that opens an argv ({"qemu-img", ...}) or a shell command line ("sh", "-c", "...").
    for path in source_files(CPP_SOURCES, (".cc", ".h")):
        with open(path, errors="replace") as f:
            for n, line in enumerate(f, 1):
                for m in re.finditer(r'[{(]\s*"([a-z][a-z0-9_.+-]*)"\s*,', line):
                    words.setdefault(m.group(1), f"{os.path.relpath(path, ROOT)}:{n}")
                for m in re.finditer(r'"-c",\s*"((?:[^"\\]|\\.)*)"', line):
                    for w in shell_commands(m.group(1)):
                        words.setdefault(w, f"{os.path.relpath(path, ROOT)}:{n}")
    return words


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", default=[], help="a configured and built build dir")
    ap.add_argument("--packages", help="file with the package list (default: install-deps.sh --list)")
    ap.add_argument("--file", action="append", default=[], help="also check this file (for tests)")
    ap.add_argument("--no-programs", action="store_true", help="skip the scan for programs")
    args = ap.parse_args()

    listed = listed_packages(args.packages)
    status = run(["dpkg-query", "-W", "-f=${Package}\t${db:Status-Status}\n"], check=False).stdout
    installed = {l.split("\t")[0] for l in status.splitlines() if l.endswith("\tinstalled")}
    problems = [f"listed package {p} is not installed (run scripts/install-deps.sh)"
                for p in listed if p not in installed]

    allowed_pkgs = closure(listed) | closure(base_packages())
    allowed_files = owned_files(allowed_pkgs)

    uses = {}  # path -> what uses it
    for b in args.build:
        for f in build_files(b):
            uses.setdefault(f, f"the build in {b}")
    for f in args.file:
        uses.setdefault(f, "--file")
    if not args.no_programs:
        for word, where in program_words().items():
            if word in NOT_RUN:
                continue
            exe = shutil.which(word)
            if exe and (exe.startswith("/usr/") or exe.startswith("/bin/") or exe.startswith("/sbin/")):
                uses.setdefault(exe, f"program `{word}` named at {where}")

    checked = 0
    for path, why in sorted(uses.items()):
        checked += 1
        if canonical(path) in allowed_files or canonical(os.path.realpath(path)) in allowed_files:
            continue
        pkg = owner(path)
        if pkg is None:
            problems.append(f"{path} ({why}) belongs to no Debian package; install it from a package")
        elif pkg not in allowed_pkgs:
            problems.append(f"{path} ({why}) comes from package {pkg}, which install-deps.sh does not "
                            f"reach: add `{pkg}` to the packages list in scripts/install-deps.sh")
    for p in problems:
        print(f"check-deps: {p}", file=sys.stderr)
    print(f"check-deps: {checked} files and programs checked against {len(listed)} listed packages "
          f"({len(allowed_pkgs)} with dependencies and the base): {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
