# Recipes for the ctrl / krane workspace.

# How long each fuzzer of `fuzz` runs, in seconds.
fuzz_seconds := env_var_or_default("FUZZ_SECONDS", "60")

default: check

# Formatting, lints and tests: what CI runs.
check:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo test --workspace

# `test-unit` and `test-integration` together run the same tests, split.
# Every test: the README's test command.
test:
    cargo test --workspace

# Every crate's library and binaries, doc tests, and the in-process test
# targets of wire, storage and transport (golden bytes, round trips,
# hostile frames, a few seconds of wire's fuzzer).
# Unit tests: no node cluster, no child process.
test-unit:
    cargo test --workspace --lib --bins
    cargo test --workspace --doc
    cargo test -p wire -p storage -p transport --test '*'

# node's and krane's test targets (the real `ctrl` and `krane` binaries
# as child processes) and every test target of integration (sites of
# nodes, simulators and kranes; the tree's rules, `tidy`). Bounded:
# `chaos` runs its seeds within 120 s; `rolling_upgrade` is skipped,
# saying so, unless CTRL_PREV_BIN names a `ctrl` of the previous release;
# the fuzz inputs run 4 s here. The sentinel's: loopback upstreams, its
# binary, and its ConfigMap watch against the simulator.
# Multi-process and multi-node tests.
test-integration:
    cargo test -p node -p agent --test '*'
    cargo test -p sentinel --test '*'
    cargo test -p integration --test '*'

# The tree's rules: crate and module dependencies, node's layers, docs.
tidy:
    cargo test -p integration --test tidy

# The client protocols' decoders, then the other untrusted inputs (Raft
# frames and log records, snapshots, backups, config files); a release
# build, as the README's long runs.
# The fuzzers, each for FUZZ_SECONDS (default 60).
fuzz:
    FUZZ_SECONDS={{fuzz_seconds}} cargo test --release -p wire --test fuzz -- --nocapture
    FUZZ_SECONDS={{fuzz_seconds}} cargo test --release -p integration --test fuzz_inputs -- --nocapture

# Format the code.
fmt:
    cargo fmt --all

# Benchmarks (release build); SCENARIO as listed by --help.
bench SCENARIO="deploy-to-watch":
    cargo run --release -p integration --bin bench -- {{SCENARIO}}

# A simulated Kubernetes API server on loopback (kubectl works against it).
sim PORT="6443":
    cargo run --release -p k8s-sim -- --port {{PORT}} --kubeconfig sim.kubeconfig

# Run the embedded single-node default.
serve:
    cargo run --release -p node --bin ctrl -- serve
