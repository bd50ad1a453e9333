//! Records the git revision the binary is built from, so `machine.txt` names
//! the code that was measured rather than whatever is checked out when a long
//! run ends. Without `rerun-if-changed` lines, cargo runs this again whenever
//! a file of the package changes.
use std::process::Command;

fn main() {
    let revision = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PROMLAB_GIT_REVISION={revision}");
}
