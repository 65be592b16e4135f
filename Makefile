# SPACE: two commands on a fresh Debian 12 machine, as root:
#   make run    install what is missing, build, build or reuse the guest images, start spaced
#   make test   install what is missing, build (also with ASan/UBSan), run every test
.PHONY: all deps build build-asan build-fuzz images ui run test test-unit test-fuzz bench soak format clean

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
IMAGES     := $(BUILD)/images
JOBS       ?= $(shell nproc)

# Compiles are cached outside the clone, like the guest images, so a second `make test` on the
# same machine (a new clone included) recompiles only what changed: three builds (release,
# ASan, fuzz) are most of a cold run's time on 2 cores. BASEDIR and NOHASHDIR make the cache
# independent of where the clone lives.
ifeq ($(origin CCACHE_DIR),undefined)
CCACHE_DIR := $(if $(shell mkdir -p /var/cache/space/ccache 2>/dev/null && test -w /var/cache/space/ccache && echo y),/var/cache/space/ccache,$(HOME)/.cache/ccache)
endif
export CCACHE_DIR
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true
export CCACHE_MAXSIZE ?= 6G
LAUNCHER   := -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache

all: build

# What the three builds take in a new clone (measured 5.5 GiB after `make test`) and what the
# caches in /var/cache/space take on a new machine (compiles 2.5 GiB, guest images 2 GiB, the
# kernel's build tree 2 GiB while it builds), in MiB, with some room: a full disk then stops the
# run at once with a clear message instead of in a linker minutes later.
CLONE_DISK_MIB ?= 6144
CACHE_DISK_MIB ?= 7680

deps:
	@scripts/install-deps.sh
	@scripts/check-disk.sh $(CLONE_DISK_MIB) $(CACHE_DISK_MIB) $(CURDIR) /var/cache/space $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo

$(BUILD_ASAN)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD_ASAN) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=Debug -DSPACE_SANITIZE=ON

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD) -j $(JOBS)

# The fuzz targets: clang, every library instrumented for coverage (tests/fuzz).
# binutils' ar, not llvm-ar (which CMake prefers with clang when some other package brought it):
# the same tools on every machine, and only packages the install script lists.
$(BUILD_FUZZ)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD_FUZZ) -G Ninja $(LAUNCHER) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_AR=/usr/bin/ar -DCMAKE_RANLIB=/usr/bin/ranlib -DSPACE_FUZZ=ON

build-asan: deps $(BUILD_ASAN)/build.ninja
	ninja -C $(BUILD_ASAN) -j $(JOBS) space_unit_tests space_http_tests space_store_tests space_net_unit_tests space_gateway_unit_tests

# Guest kernel and root filesystem, and SPACE's QEMU (the installed Debian QEMU's source, built
# for microvm and virtio-mmio only), cached by recipe hash under /var/cache/space/images;
# $(IMAGES) holds links to the current ones.
images: build
	@mkdir -p $(IMAGES)
	@qemu_dir=$$(images/build-qemu.sh) && ln -sfn "$$qemu_dir/qemu-system-x86_64" $(IMAGES)/qemu-system-x86_64
	@kernel_dir=$$(images/build-kernel.sh) && ln -sfn "$$kernel_dir/vmlinux" $(IMAGES)/vmlinux
	@rootfs_dir=$$(SPACE_AGENT_BIN=$(BUILD)/bin/space-agent images/build-rootfs.sh) && \
	  ln -sfn "$$rootfs_dir/rootfs.ext4" $(IMAGES)/rootfs.ext4

# The web console spaced serves at /ui/ (ui/: npm packages pinned by its lock file, bundled with
# esbuild); spaced's default --ui-dir is this folder.
ui: deps
	@scripts/build-ui.sh $(BUILD)/ui

# Starts spaced in the foreground on embedded defaults (data in $(DATA_DIR), SQLite, template
# "base" = the images above) and links spacectl into /usr/local/bin when that is writable.
DATA_DIR ?= /var/lib/space
LISTEN   ?= 127.0.0.1:8080
run: build images ui
	@if [ -w /usr/local/bin ]; then ln -sfn $(abspath $(BUILD)/bin/spacectl) /usr/local/bin/spacectl; fi
	SPACE_PRINT_KEY=1 exec $(BUILD)/bin/spaced --listen $(LISTEN) --data-dir $(DATA_DIR)

# Per-test timeouts are set in CMake; --stop-time bounds the whole run as well (tests still
# running then fail), well inside CI's 90 minutes: measured 4 min, `make test` 11 min cold.
test-unit: build build-asan
	cd $(BUILD_ASAN) && ctest -L unit --output-on-failure -j $(JOBS) --stop-time "$$(date -d '+10 min' +%H:%M:%S)"

build-fuzz: deps $(BUILD_FUZZ)/build.ninja
	ninja -C $(BUILD_FUZZ) -j $(JOBS) fuzz_host_decoders fuzz_gateway_parsers

# Each fuzz target for a fixed 30 s over the corpus in tests/fuzz/corpus.
test-fuzz: build-fuzz
	cd $(BUILD_FUZZ) && ctest -L fuzz --output-on-failure

# check-deps: everything the build read and the scripts run comes from a listed package.
test: test-unit test-fuzz images ui
	scripts/check-deps.py --build $(BUILD) --build $(BUILD_ASAN) --build $(BUILD_FUZZ)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --stop-time "$$(date -d '+40 min' +%H:%M:%S)"

# Every benchmark whose numbers bench/RESULTS.md shows, with the commands recorded there
# (about 40 min on 2 cores; run one line alone to reproduce one table).
bench: build images
	bench/boot_bench.sh 20 tcg
	bench/jail_bench.sh 30 $(BUILD)
	$(BUILD)/bin/space-agent-bench --runs 200 --file-mib 64
	$(BUILD)/bin/space-api-bench --creates 20 --execs 200 --no-snapshots
	$(BUILD)/bin/space-api-bench --creates 30 --execs 100
	$(BUILD)/bin/space-api-bench --creates 50 --execs 40 --warm-pool 2
	$(BUILD)/bin/space-api-bench --creates 50 --execs 40 --warm-pool 2 --network
	$(BUILD)/bin/space-api-bench --creates 15 --execs 20 --jail off
	$(BUILD)/bin/space-api-bench --creates 15 --execs 20 --jail auto
	$(BUILD)/bin/space-api-bench --creates 15 --execs 20 --jail auto --vm-uid-base 0
	$(BUILD)/bin/space-api-bench --creates 15 --execs 20 --jail auto --disk-mib-per-vcpu 0 --disk-iops-per-vcpu 0
	$(BUILD)/bin/space-api-bench --creates 15 --execs 20 --jail auto --network
	$(BUILD)/bin/space-qemu-bench --template /tmp/space-qemu-bench-template --startup 30 --memory-rounds 3
	bench/qemu_minimal.sh $(BUILD) 4 10
	bench/qemu_create.sh $(BUILD) 4 20
	taskset -c 0 $(BUILD)/bin/space-net-bench
	$(BUILD)/bin/space-net-bench
	$(BUILD)/bin/space-lifecycle-bench --creates 200 --warm-pool 2 --baseline-creates 30 --cold-creates 10 \
	  --floor 30 --concurrent 20 --ops 20 --snapshots 10 --branch 10,50 --branch-baseline 5 \
	  --memory-sandboxes 10 --cold-memory-sandboxes 3 --idle-s 5 --dos-seconds 0
	$(BUILD)/bin/space-lifecycle-bench --skip create,concurrent,ops,branch,memory --dos-seconds 10
	bench/e2b_streams.sh 10 50

# kill -9 of spaced, QEMUs and gateways at random points of every lifecycle operation, then the
# checks that nothing broke or leaked (`make test` runs 6 rounds). SEED=n repeats a run; a
# failure prints its seed and round. About 2 s a round on 2 cores.
ROUNDS ?= 200
soak: build images
	cd $(BUILD) && SPACE_SOAK_ROUNDS=$(ROUNDS) $(if $(SEED),SPACE_SOAK_SEED=$(SEED)) \
	  bin/space_spaced_tests --gtest_filter='SpacedSoakTest.*'

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
