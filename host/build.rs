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
    if let Err(why) = ensure_wasm_target(workspace) {
        // One line, naming what to run: cargo shows a build script's panic
        // message as the error.
        panic!("{why}");
    }
    let core_module = build_guest(workspace);
    let component = componentize(&core_module);
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it")).join("stile_dedup.wasm");
    std::fs::write(&out, component).expect("write the component");
    // A stable copy beside the other build outputs, for other hosts to load.
    let published = workspace.join("target").join("stile_dedup.wasm");
    let _ = std::fs::write(published, std::fs::read(&out).expect("read back the component"));
}

/// Makes sure the toolchain can build for [`WASM_TARGET`]: rustup's automatic
/// installs may be off (`RUSTUP_AUTO_INSTALL=0`), and then `rust-toolchain.toml`
/// alone installs nothing. Where rustup manages the toolchain, the target is
/// added through it (saying so in one line); elsewhere the error names the
/// command to run.
fn ensure_wasm_target(workspace: &Path) -> Result<(), String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .arg("--print")
        .arg("sysroot")
        .current_dir(workspace)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", Path::new(&rustc).display()))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let installed = |sysroot: &Path| sysroot.join("lib/rustlib").join(WASM_TARGET).join("lib").is_dir();
    if installed(&sysroot) {
        return Ok(());
    }
    let install = format!("rustup target add {WASM_TARGET}");
    println!("cargo:warning=the {WASM_TARGET} target is not installed; installing it with `{install}`");
    let added = Command::new("rustup").args(["target", "add", WASM_TARGET]).current_dir(workspace).status();
    match added {
        Ok(status) if status.success() && installed(&sysroot) => Ok(()),
        Ok(status) => Err(format!("the {WASM_TARGET} target is missing and `{install}` failed ({status}): run it by hand")),
        Err(_) => Err(format!(
            "the {WASM_TARGET} target is missing from {} and rustup is not available: install the target for this \
             toolchain (with rustup: `{install}`)",
            sysroot.display()
        )),
    }
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
