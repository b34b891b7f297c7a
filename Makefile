# DetShare build. `make build` puts everything in build/ and touches nothing outside the repository; `make install`
# copies it to FHS paths (PREFIX, DESTDIR), `make deb` packages it.
GO        ?= go
CC        ?= gcc
BUILD     := $(CURDIR)/build
BIN       := $(BUILD)/bin
LIB       := $(BUILD)/lib
TESTBIN   := $(BUILD)/tests
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# -trimpath and a fixed build id keep builds reproducible; lazy binding lets binaries that link go-nvml start on
# hosts without the NVIDIA driver (DESIGN.md §2).
GOFLAGS_BUILD := -trimpath -buildvcs=false
GOLDFLAGS := -s -w -buildid= -X github.com/detshare/detshare/cmd/detshare/version.Version=$(VERSION) -extldflags "-Wl,-z,lazy"
CFLAGS_COMMON := -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -D_GNU_SOURCE -I$(CURDIR)
CMDS      := $(notdir $(wildcard cmd/*))
# go-nvml declares deprecated NVML calls; its cgo prologue warns about every one of them.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
# Go from https://go.dev/dl is in /usr/local/go/bin and dockerd/runc are in /usr/sbin: `sudo make test` (secure_path)
# or a user's PATH may lack one of them, and the tests run go, dockerd and runc by name. Appended: a PATH entry wins.
export PATH := $(PATH):/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin

# Installation (FHS). The binaries find the library relative to themselves ($(PREFIX)/lib/detshare), see
# internal/layout, so DESTDIR staging and private prefixes work without configuration.
PREFIX         ?= /usr/local
DESTDIR        ?=
BINDIR         ?= $(PREFIX)/bin
DSLIBDIR       ?= $(PREFIX)/lib/detshare
SHAREDIR       ?= $(PREFIX)/share/detshare
SYSCONFDIR     ?= /etc
SYSTEMDUNITDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/systemd/system,/etc/systemd/system)
# the serving shim before the front that starts it (install copies in this order)
INSTALL_BINS   := detshare detshare-hook detshare-runtime containerd-shim-detshare-v1-serve containerd-shim-detshare-v1
DEB_VERSION    ?= 0.1.0+git$(shell git rev-parse --short HEAD 2>/dev/null || echo 0)
DEB_ARCH       ?= $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_ROOT       := $(BUILD)/deb/root
DEB_FILE       := $(BUILD)/deb/detshare_$(DEB_VERSION)_$(DEB_ARCH).deb

.PHONY: all build go-build c-build deps test test-components lint clean demo install install-files uninstall deb installer-image
all: build

build: c-build go-build

# The Kubernetes side (device plugin, DRA plugin, their end-to-end test) is its own module, k8s/go.mod, so that the main module
# keeps containerd v1.7's dependency set.
# The shim (the front containerd executes for start and delete, and the serving shim it starts) is built without cgo,
# as containerd builds its own shims: it links no C (go-nvml stays out of it) and a static binary starts faster;
# containerd executes the shim binary three times per container (BENCHMARKS.md, "Issue 28: container start").
STATIC_CMDS := containerd-shim-detshare-v1 containerd-shim-detshare-v1-serve
go-build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -ldflags '$(GOLDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(filter-out $(STATIC_CMDS) internal,$(CMDS)))
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -ldflags '$(GOLDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(STATIC_CMDS))
	cd k8s && $(GO) build $(GOFLAGS_BUILD) -ldflags '$(GOLDFLAGS)' -o $(BIN)/ ./cmd/...

# C components append their outputs to C_TARGETS in their build.mk.
C_TARGETS :=
-include $(sort $(wildcard cgroupgpu/libdetshare/build.mk integration/*/build.mk))
c-build: $(C_TARGETS)

# The real Kubernetes-side components (containerd 2.x, kubelet, kube-apiserver, etcd, CNI loopback, helm) are built
# from the Go module proxy once and cached in $(K8S_CACHE) (about 25 minutes cold on 2 cores, seconds when cached).
K8S_CACHE ?= $(or $(DETSHARE_K8S_CACHE),/var/cache/detshare-k8s)
test-components:
	DETSHARE_K8S_CACHE=$(K8S_CACHE) integration/kubernetes/build-components.sh

# What the tests need from the distribution (containerd, runc, docker.io, podman, python3-torch, ...): checked, and
# installed with apt-get after asking (without asking when stdin is not a terminal, or DEPS_ARGS=--yes).
DEPS_ARGS ?=
deps:
	integration/deps.sh test $(DEPS_ARGS)

# Every test: the main module, the Kubernetes module, and the container suite once more against containerd 2.x.
# deps first, also under make -j: the build and the tests need what it installs.
test: deps
	$(MAKE) --no-print-directory build test-components
	$(GO) test -count=1 -timeout 60m ./...
	cd k8s && DETSHARE_K8S_CACHE=$(K8S_CACHE) $(GO) test -count=1 -timeout 30m ./...
	DETSHARE_CONTAINERD_BIN=$(K8S_CACHE)/containerd-v2.2.9/bin $(GO) test -count=1 -timeout 20m ./integration/containers/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd k8s && $(GO) vet ./...
	$(MAKE) -B c-build CFLAGS_EXTRA=-Werror

# The installer image the Helm chart (configs/helm/detshare) runs, packed offline from the build into an image tar
# (ctr -n k8s.io images import / docker load); k8s/Dockerfile.installer builds the same with Docker.
INSTALLER_TAG ?= detshare-installer:latest
installer-image: build
	cd k8s && $(GO) run ./tools/installer-image -build $(BUILD) -o $(BUILD)/images/detshare-installer.tar -tag $(INSTALLER_TAG)

clean:
	rm -rf $(BUILD)

# install: binaries, the library, the scheduler's systemd unit (ExecStart pointing at $(BINDIR)), the host config
# (kept when present: it is the admin's) and the podman/CRI-O hooks.d files (not enabled: copy them to
# /etc/containers/oci/hooks.d to run the hook for every podman container). It registers nothing with the engines:
# `detshare install docker|containerd` does, and says what it changed.
install: build install-files
	@echo "installed under $(DESTDIR)$(PREFIX); next: $(BINDIR)/detshare install containerd|docker, then $(BINDIR)/detshare doctor"

install-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(DSLIBDIR) $(DESTDIR)$(SYSCONFDIR)/detshare $(DESTDIR)$(SYSTEMDUNITDIR) \
		$(DESTDIR)$(SHAREDIR)/hooks.d
	install -m 0755 $(addprefix $(BIN)/,$(INSTALL_BINS)) $(DESTDIR)$(BINDIR)/
	install -m 0644 $(LIB)/libdetshare.so $(DESTDIR)$(DSLIBDIR)/libdetshare.so
	# the simulated GPU (a test double, on no loader path) for `detshare doctor --simulated-gpu` and GPU-less trials
	install -d $(DESTDIR)$(DSLIBDIR)/simgpu
	for f in libcuda.so.1 libnvidia-ml.so.1; do test ! -e $(LIB)/simgpu/$$f || \
		install -m 0644 $(LIB)/simgpu/$$f $(DESTDIR)$(DSLIBDIR)/simgpu/$$f; done
	sed 's|/usr/local/bin/detshare|$(BINDIR)/detshare|; s|/etc/detshare/|$(SYSCONFDIR)/detshare/|' \
		configs/systemd/detshare-sched.service > $(DESTDIR)$(SYSTEMDUNITDIR)/detshare-sched.service
	chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/detshare-sched.service
	test -e $(DESTDIR)$(SYSCONFDIR)/detshare/config.toml || \
		install -m 0644 configs/detshare/config.toml $(DESTDIR)$(SYSCONFDIR)/detshare/config.toml
	for f in configs/hooks.d/*.json; do \
		sed 's|/usr/bin/detshare-hook|$(BINDIR)/detshare-hook|' $$f > $(DESTDIR)$(SHAREDIR)/hooks.d/$$(basename $$f); done

# uninstall removes what install-files put there except a config.toml the admin changed; run
# `detshare uninstall` first to unregister the runtimes.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALL_BINS)) $(DESTDIR)$(DSLIBDIR)/libdetshare.so \
		$(DESTDIR)$(DSLIBDIR)/simgpu/libcuda.so.1 $(DESTDIR)$(DSLIBDIR)/simgpu/libnvidia-ml.so.1 \
		$(DESTDIR)$(SYSTEMDUNITDIR)/detshare-sched.service $(DESTDIR)$(SHAREDIR)/hooks.d/*.json
	if cmp -s configs/detshare/config.toml $(DESTDIR)$(SYSCONFDIR)/detshare/config.toml; then \
		rm -f $(DESTDIR)$(SYSCONFDIR)/detshare/config.toml; fi
	-rmdir $(DESTDIR)$(DSLIBDIR)/simgpu $(DESTDIR)$(DSLIBDIR) $(DESTDIR)$(SHAREDIR)/hooks.d $(DESTDIR)$(SHAREDIR) $(DESTDIR)$(SYSCONFDIR)/detshare 2>/dev/null

# deb: a Debian package of the same files (PREFIX=/usr) whose postinst registers the runtimes with the engines
# present (detshare install) and whose prerm unregisters them (packaging/deb/).
deb: build
	rm -rf $(BUILD)/deb
	$(MAKE) --no-print-directory install-files DESTDIR=$(DEB_ROOT) PREFIX=/usr
	install -d $(DEB_ROOT)/DEBIAN
	sed 's|@VERSION@|$(DEB_VERSION)|; s|@ARCH@|$(DEB_ARCH)|' packaging/deb/control > $(DEB_ROOT)/DEBIAN/control
	install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm $(DEB_ROOT)/DEBIAN/
	echo /etc/detshare/config.toml > $(DEB_ROOT)/DEBIAN/conffiles
	dpkg-deb --root-owner-group --build $(DEB_ROOT) $(DEB_FILE)
	@echo "built $(DEB_FILE)"
