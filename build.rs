//! Build information for `unihal --version` and reports: target triple, profile and git commit.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=.git/HEAD");
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=UNIHAL_BUILD_TARGET={target}");
    println!("cargo:rustc-env=UNIHAL_BUILD_PROFILE={profile}");
    println!("cargo:rustc-env=UNIHAL_BUILD_COMMIT={commit}");
}
