//! Makes the simulated CANN installs a backend is pointed at: `<root>/classic/lib64` and
//! `<root>/split/lib64` (the forwarding libraries of each CANN layout next to a link to the
//! simulator object), and prints their paths. Usage:
//! `make_layout <root> <path of libunihal_sim_cann.so>`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, object] = args.as_slice() else {
        eprintln!("usage: make_layout <root> <libunihal_sim_cann.so>");
        std::process::exit(2);
    };
    for layout in [
        unihal_sim_cann::layout::Layout::Classic,
        unihal_sim_cann::layout::Layout::Split,
    ] {
        match unihal_sim_cann::layout::make(root.as_ref(), layout, object.as_ref()) {
            Ok(dir) => println!("{}", dir.display()),
            Err(e) => {
                eprintln!("make_layout: {layout:?}: {e}");
                std::process::exit(1);
            }
        }
    }
}
