# gpufleet.sglang: every target sets itself up (virtualenv, apt packages).
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.collections
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export CONTAINERS_CONF := $(CURDIR)/molecule/containers.conf

.PHONY: help setup sysdeps demo demo-clean test unit integration lint sanity real-server molecule image matrix bench build clean

help:
	@echo "make demo        redeploy the incident's server on an embedded simulated 8xH200 node"
	@echo "make demo-clean  stop what the demo started (by PID) and remove .demo/"
	@echo "make test        the whole suite: unit, integration, lint, sanity, molecule"
	@echo "make real-server the real SGLang 0.5.23 server on this CPU: stand-ins, simulated GPUs, conformance"
	@echo "make matrix      the support matrix: ansible-core 2.17/2.18/2.20/2.21, Debian 11/13 nodes, the user install, the EE"
	@echo "make bench       outage, overlap, teardown, fleet, oracle and checkpoint benchmarks; real-SGLang outage when its venv is built"
	@echo "make build       ansible-galaxy collection build"

setup:
	@scripts/setup-venv.sh

sysdeps:
	@scripts/install-system-deps.sh

demo: setup
	@scripts/demo.sh

demo-clean:
	@scripts/demo.sh --clean

test: setup sysdeps
	@$(VENV)/bin/python scripts/run-tests.py

unit integration lint sanity real-server: setup
	@$(VENV)/bin/python scripts/run-tests.py $@

molecule: setup sysdeps
	@$(VENV)/bin/python scripts/run-tests.py image molecule-default molecule-faults molecule-multinode molecule-containerised

image: sysdeps
	@scripts/build-image.sh

# The support matrix alone (docs/development.md "Support matrix"); make test runs it too.
matrix: setup sysdeps
	@$(VENV)/bin/python scripts/run-tests.py image-bullseye image-trixie core-2.20-image core-2.21-image \
		molecule-bullseye molecule-trixie core-2.17-unit core-2.18-unit core-2.20-unit core-2.21-unit \
		core-2.17-sanity core-2.18-sanity core-2.20-sanity core-2.21-sanity ee-build core-2.17-redeploy \
		core-2.18-redeploy core-2.20-redeploy core-2.21-redeploy user-install ee

bench: setup
	@$(VENV)/bin/python bench/run.py

# Built aside and renamed into place: stages that run side by side (unit, integration, user-install, ee-build)
# each build, and a reader never sees a half-written tarball.
build: setup
	@mkdir -p .cache/build && tmp=$$(mktemp -d .cache/build/.tmp.XXXXXX) \
		&& ansible-galaxy collection build --force --output-path "$$tmp" . \
		&& mv -f "$$tmp"/*.tar.gz .cache/build/ && rmdir "$$tmp"

clean: demo-clean
	rm -rf .cache tests/output
