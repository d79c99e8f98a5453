//! One rank per "process": ranks that bootstrap their world through the launcher variables and
//! rank 0's TCP store (here threads with torchrun-style `LaunchInfo`s on the CPU backend, whose
//! in-process engine joins them) train exactly as the in-process data-parallel run.

use gpt::{Corpus, TrainConfig};
use unihal::bootstrap::LaunchInfo;

#[test]
fn store_bootstrapped_ranks_match_in_process_data_parallel() {
    let backend = unihal::registry().get("cpu").unwrap();
    let corpus = Corpus::documentation();
    let cfg = TrainConfig {
        steps: 5,
        ..TrainConfig::default()
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let losses: Vec<Vec<f32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (backend, corpus, cfg) = (&backend, &corpus, &cfg);
                s.spawn(move || {
                    let info = LaunchInfo::new(rank, 2, Some(("127.0.0.1".into(), port)));
                    gpt::launch::train_process(&**backend, &info, corpus, cfg, &|_| {})
                        .unwrap()
                        .losses()
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let in_process = gpt::train_devices(&*backend, 2, &corpus, &cfg, &|_| {})
        .unwrap()
        .losses();
    assert_eq!(
        losses[0], losses[1],
        "the ranks disagree on the global loss"
    );
    assert_eq!(losses[0], in_process);
}
