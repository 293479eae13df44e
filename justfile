# Recipes for the ctrl / krane workspace.

default: check

# Formatting, lints and tests: what CI runs.
check:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo test --workspace

# Tests only.
test:
    cargo test --workspace

# Multi-process and multi-node tests.
test-integration:
    cargo test -p node --test process
    cargo test -p integration

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
