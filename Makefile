# DetShare build. Everything lands in build/; nothing outside the repository is touched.
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

.PHONY: all build go-build c-build test lint clean demo installer-image
all: build

build: c-build go-build

# The Kubernetes side (device plugin, its end-to-end test) is its own module, k8s/go.mod, so that the main module
# keeps containerd v1.7's dependency set.
go-build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -ldflags '$(GOLDFLAGS)' -o $(BIN)/ ./cmd/...
	cd k8s && $(GO) build $(GOFLAGS_BUILD) -ldflags '$(GOLDFLAGS)' -o $(BIN)/ ./cmd/...

# C components append their outputs to C_TARGETS in their build.mk.
C_TARGETS :=
-include $(sort $(wildcard cgroupgpu/libdetshare/build.mk integration/*/build.mk))
c-build: $(C_TARGETS)

test: build
	$(GO) test -count=1 -timeout 60m ./...
	cd k8s && $(GO) test -count=1 -timeout 30m ./...

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
