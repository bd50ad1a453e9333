//! Records what built the binary, so `machine.txt` names the code and the
//! compiler that were measured rather than whatever is checked out, or first
//! on `PATH`, when a long run ends: the git revision, and the `rustc` cargo ran
//! (`RUSTC`), the target triple and the profile. It runs again when the
//! checkout's HEAD or index moves (a commit, a checkout, `git add`) or any
//! source of the workspace changes — the library's too, which cargo would not
//! watch for this package by itself.
use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    for watched in [
        "../../.git/HEAD",
        "../../.git/index",
        "../../src",
        "../../benches",
        "../../Cargo.toml",
        "src",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={watched}");
    }
    let revision = output("git", &["describe", "--always", "--dirty", "--abbrev=7"]);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let version = output(&rustc, &["--version"]);
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| "unknown".to_string());
    println!(
        "cargo:rustc-env=PROMLAB_GIT_REVISION={}",
        revision.as_deref().unwrap_or("unknown")
    );
    println!(
        "cargo:rustc-env=PROMLAB_RUSTC_VERSION={}",
        version.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rustc-env=PROMLAB_TARGET={}", env("TARGET"));
    // `release` for the release and bench profiles, `debug` for dev and test.
    println!("cargo:rustc-env=PROMLAB_PROFILE={}", env("PROFILE"));
    println!("cargo:rustc-env=PROMLAB_OPT_LEVEL={}", env("OPT_LEVEL"));
}
