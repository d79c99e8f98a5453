//! `unihal-hiprtc-helper`: compiles one HIP source with hiprtc, in a process of its own.
//!
//! hiprtc 5.x aborts the whole process on architectures it does not know; the HIP backend runs
//! those compilations here so that such an abort kills only this helper and comes back to the
//! caller as an error naming the architecture.
//!
//! Usage: `unihal-hiprtc-helper --arch <gfx...> --name <file name> --source <path>`; the code
//! object on standard output (exit 0), the compiler's message on standard error (exit 1).
//! Missing arguments: exit 2.

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(arch), Some(name), Some(source)) =
        (value("--arch"), value("--name"), value("--source"))
    else {
        eprintln!("usage: unihal-hiprtc-helper --arch <gfx...> --name <file name> --source <path>");
        std::process::exit(2);
    };
    let src = match std::fs::read_to_string(&source) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("reading the source {source}: {e}");
            std::process::exit(1);
        }
    };
    let result = unihal_kernels::rtc::hiprtc::Hiprtc::load()
        .and_then(|rtc| rtc.compile_unchecked(&src, &name, &arch));
    match result {
        Ok(out) => {
            if let Err(e) = std::io::stdout().write_all(&out.code) {
                eprintln!("writing the code object: {e}");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
