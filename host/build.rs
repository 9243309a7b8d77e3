//! Builds the guest crate for `wasm32-unknown-unknown` and turns the core
//! module into a component, so that `cargo build` alone yields a gateway with
//! its cache embedded (`stile::component::COMPONENT`).
//!
//! The nested build uses its own target directory (`target/guest`), because
//! the outer build holds the lock on the main one.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const WASM_TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir.parent().expect("host/ sits in the workspace");
    for watched in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
    }
    let core_module = build_guest(workspace);
    let component = componentize(&core_module);
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it")).join("stile_dedup.wasm");
    std::fs::write(&out, component).expect("write the component");
    // A stable copy beside the other build outputs, for other hosts to load.
    let published = workspace.join("target").join("stile_dedup.wasm");
    let _ = std::fs::write(published, std::fs::read(&out).expect("read back the component"));
}

fn build_guest(workspace: &Path) -> PathBuf {
    let target_dir = workspace.join("target").join("guest");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--package", "stile-guest", "--features", "component"])
        .args(["--profile", "guest", "--target", WASM_TARGET, "--target-dir"])
        .arg(&target_dir)
        // The outer build's flags are for the host's target, not the guest's.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_MAKEFLAGS")
        .status()
        .expect("run cargo for the guest");
    assert!(status.success(), "building the guest for {WASM_TARGET} failed");
    target_dir.join(WASM_TARGET).join("guest").join("stile_guest.wasm")
}

fn componentize(core_module: &Path) -> Vec<u8> {
    let module = std::fs::read(core_module).expect("read the guest's core module");
    wit_component::ComponentEncoder::default()
        .module(&module)
        .expect("the core module carries its component type")
        .validate(true)
        .encode()
        .expect("encode the component")
}
