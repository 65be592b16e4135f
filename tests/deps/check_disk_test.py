#!/usr/bin/env python3
"""scripts/check-disk.sh must stop the build, saying where and how much, when a disk cannot hold
it; count what the build folders and caches already hold; and sum the two when they share one
filesystem. Each case runs on a small tmpfs of its own, in a mount namespace of its own."""

import os
import subprocess
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts/check-disk.sh")

# Inside a new mount namespace: two 64 MiB tmpfs (clone and cache), files of the sizes given,
# then the check with the arguments given. $C and $K name the two mounts.
SETUP = """set -e
C=$(mktemp -d) K=$(mktemp -d)
mount -t tmpfs -o size=64m tmpfs "$C"
if [ "$SAME_FS" = 1 ]; then mkdir "$C/cache"; K="$C/cache"; else mount -t tmpfs -o size=64m tmpfs "$K"; fi
mkdir -p "$C/build" "$K/ccache"
head -c $((BUILD_MIB * 1048576)) /dev/zero > "$C/build/objects"
head -c $((CACHE_MIB_HELD * 1048576)) /dev/zero > "$K/ccache/objects"
set +e
"$CHECK" "$CLONE_MIB" "$CACHE_MIB" "$C" "$K" "$C/build" "$C/build-asan"
"""


def run(clone_mib, cache_mib, build_mib=0, cache_held_mib=0, same_fs=False, skip=False):
    env = dict(os.environ, CHECK=CHECK, CLONE_MIB=str(clone_mib), CACHE_MIB=str(cache_mib),
               BUILD_MIB=str(build_mib), CACHE_MIB_HELD=str(cache_held_mib),
               SAME_FS="1" if same_fs else "0")
    env.pop("SPACE_SKIP_DISK_CHECK", None)
    if skip:
        env["SPACE_SKIP_DISK_CHECK"] = "1"
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", SETUP],
                          env=env, capture_output=True, text=True, timeout=60)


class CheckDiskTest(unittest.TestCase):
    def test_room_enough_passes(self):
        r = run(clone_mib=40, cache_mib=40)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_too_little_room_in_the_clone_stops_with_where_and_how_much(self):
        r = run(clone_mib=100, cache_mib=10)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the builds in the clone need about 100 MiB more", r.stderr)
        self.assertIn("which has 64 MiB free", r.stderr)
        self.assertIn("SPACE_SKIP_DISK_CHECK=1", r.stderr)

    def test_too_little_room_for_the_caches_names_them(self):
        r = run(clone_mib=10, cache_mib=100)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the caches in", r.stderr)
        self.assertIn("need about 100 MiB more", r.stderr)

    def test_what_the_builds_and_caches_hold_counts_against_their_need(self):
        # 40 MiB held of a 90 MiB need: 50 more, on a tmpfs with 24 MiB left, fails; the cache's
        # 30 of 80 leaves 50 on its own 64 MiB tmpfs (34 free after the 30): fails too. With
        # needs of 60 each, 20 and 30 more fit.
        r = run(clone_mib=90, cache_mib=10, build_mib=40)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("need about 50 MiB more", r.stderr)
        r = run(clone_mib=60, cache_mib=60, build_mib=40, cache_held_mib=30)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_one_filesystem_must_hold_both(self):
        # 40 + 40 fit two 64 MiB filesystems, not one.
        self.assertEqual(run(clone_mib=40, cache_mib=40, same_fs=False).returncode, 0)
        r = run(clone_mib=40, cache_mib=40, same_fs=True)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the builds in the clone and the caches in", r.stderr)
        self.assertIn("need about 80 MiB more", r.stderr)

    def test_skip_and_bad_arguments(self):
        self.assertEqual(run(clone_mib=1000, cache_mib=1000, skip=True).returncode, 0)
        r = subprocess.run([CHECK, "6G", "1", "/", "/"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("'6G' is not a number of MiB", r.stderr)


if __name__ == "__main__":
    unittest.main()
