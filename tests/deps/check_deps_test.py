#!/usr/bin/env python3
"""scripts/check-deps.py must fail, naming the package and the line to add, when something the
build uses comes from a package that install-deps.sh does not list; and pass when it does."""

import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts/check-deps.py")
HEADER = "/usr/include/sqlite3.h"  # from libsqlite3-dev, which the build needs and the list has


def listed():
    out = subprocess.run([os.path.join(ROOT, "scripts/install-deps.sh"), "--list"], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def check(packages, *extra):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(packages) + "\n")
        f.flush()
        return subprocess.run([sys.executable, CHECK, "--packages", f.name, *extra],
                              capture_output=True, text=True, timeout=120)


class CheckDepsTest(unittest.TestCase):
    def test_list_names_the_packages(self):
        packages = listed()
        for p in ("libnghttp2-dev", "qemu-system-x86", "debootstrap", "jq", "curl"):
            self.assertIn(p, packages)

    def test_header_from_an_unlisted_package_fails_with_the_fix(self):
        packages = [p for p in listed() if p != "libsqlite3-dev"]
        r = check(packages, "--no-programs", "--file", HEADER)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(HEADER, r.stderr)
        self.assertIn("comes from package libsqlite3-dev", r.stderr)
        self.assertIn("add `libsqlite3-dev` to the packages list in scripts/install-deps.sh", r.stderr)

    def test_header_from_a_listed_package_passes(self):
        r = check(listed(), "--no-programs", "--file", HEADER)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("0 problem(s)", r.stdout)

    def test_program_from_an_unlisted_package_fails(self):
        # qemu-img is run by the VM layer and the tests; without qemu-utils the scan must say so.
        packages = [p for p in listed() if p != "qemu-utils"]
        r = check(packages)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("program `qemu-img`", r.stderr)
        self.assertIn("add `qemu-utils`", r.stderr)

    def test_a_listed_package_that_is_missing_is_reported(self):
        r = check(listed() + ["space-no-such-package"], "--no-programs")
        self.assertEqual(r.returncode, 1)
        self.assertIn("listed package space-no-such-package is not installed", r.stderr)


if __name__ == "__main__":
    unittest.main()
