//! What a loader's message hides: a file built for another machine. glibc's `dlopen` reports an
//! ELF library of another architecture as "cannot open shared object file: No such file or
//! directory", which sends the user looking for a missing file; the header says what it is.

use std::io::Read;
use std::path::Path;

/// This process's ELF machine (`e_machine`) and class (`EI_CLASS`: 1 = 32-bit, 2 = 64-bit).
const HOST: (u16, u8) = (
    if cfg!(target_arch = "x86_64") {
        62
    } else if cfg!(target_arch = "aarch64") {
        183
    } else if cfg!(target_arch = "powerpc64") {
        21
    } else if cfg!(target_arch = "riscv64") {
        243
    } else {
        0
    },
    if cfg!(target_pointer_width = "64") {
        2
    } else {
        1
    },
);

fn machine_name(m: u16) -> &'static str {
    match m {
        3 => "x86",
        20 => "PowerPC",
        21 => "PowerPC64",
        40 => "ARM",
        62 => "x86-64",
        183 => "AArch64",
        243 => "RISC-V",
        258 => "LoongArch",
        _ => "another architecture",
    }
}

/// Why the ELF file at `path` cannot be loaded into this process, when its header says so (another
/// machine or word size); `None` for a file that is no ELF, cannot be read, or matches.
pub fn foreign_elf(path: &Path) -> Option<String> {
    let mut head = [0u8; 20];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if &head[..4] != b"\x7fELF" || HOST.0 == 0 {
        return None;
    }
    let class = head[4];
    let machine = match head[5] {
        1 => u16::from_le_bytes([head[18], head[19]]),
        2 => u16::from_be_bytes([head[18], head[19]]),
        _ => return None,
    };
    if (machine, class) == HOST {
        return None;
    }
    let bits = |c: u8| if c == 2 { "64-bit" } else { "32-bit" };
    Some(format!(
        "{} is built for {} ({}, ELF machine {machine}); this process runs on {} ({})",
        path.display(),
        machine_name(machine),
        bits(class),
        machine_name(HOST.0),
        bits(HOST.1)
    ))
}

/// `message` (a loader's) with what the file's header says when it is built for another machine.
pub fn explain(path: &Path, message: String) -> String {
    match foreign_elf(path) {
        Some(why) => format!("{why} (the loader said: {message})"),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_machine_is_named_and_this_one_passes() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(foreign_elf(&me), None);
        let mut bytes = std::fs::read(&me).unwrap();
        bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
        let other = std::env::temp_dir().join(format!("unihal-elf-{}", std::process::id()));
        std::fs::write(&other, &bytes[..64]).unwrap();
        let why = foreign_elf(&other).expect("an AArch64 header");
        assert!(why.contains("AArch64") && why.contains("x86-64"), "{why}");
        assert!(explain(&other, "No such file".into()).ends_with("(the loader said: No such file)"));
        std::fs::write(&other, b"not an ELF").unwrap();
        assert_eq!(foreign_elf(&other), None);
        let _ = std::fs::remove_file(&other);
    }
}
