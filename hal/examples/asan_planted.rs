//! Planted memory bugs that prove the sanitizer step of CI works: run under AddressSanitizer
//! (`scripts/asan.sh` does), `use-after-free` must be reported as a heap-use-after-free and `leak`
//! as a leak by LeakSanitizer. Without a sanitizer they do nothing observable (the freed read is
//! of a value nobody checks), which is why they live here and not in the library.

use std::hint::black_box;

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("use-after-free") => {
            let b = Box::new([7u8; 64]);
            let p = Box::into_raw(b);
            // SAFETY: deliberately unsound, the planted bug: `p` is freed here and read below.
            unsafe { drop(Box::from_raw(p)) };
            // SAFETY: deliberately unsound (see above): a read of freed memory.
            let v = unsafe { std::ptr::read_volatile(p as *const u8) };
            println!("read {v} from freed memory");
        }
        Some("leak") => {
            let v = black_box(vec![1u8; 4096]);
            std::mem::forget(v);
            println!("leaked 4096 bytes");
        }
        _ => {
            eprintln!("usage: asan_planted use-after-free|leak");
            std::process::exit(2);
        }
    }
}
