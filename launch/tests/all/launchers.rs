//! Launcher variables as real launchers set them: environments recorded from PyTorch 2.15.0's
//! torchrun and Open MPI 4.1.4's mpirun (`tests/launches/*.env`, launcher variables only), and
//! Slurm's documented srun variables.

use std::collections::HashMap;
use std::path::PathBuf;
use unihal_launch::env::{first_slurm_host, slurm_port};
use unihal_launch::{LaunchInfo, Launcher};

fn recorded(name: &str) -> HashMap<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/launches")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn info(vars: &HashMap<String, String>) -> LaunchInfo {
    LaunchInfo::from_vars(&|k| vars.get(k).cloned()).unwrap()
}

#[test]
fn torchrun_names_its_agent_store_and_error_file() {
    let vars = recorded("torchrun-2.15.0-rank1.env");
    let i = info(&vars);
    assert_eq!(
        (
            i.launcher,
            i.rank,
            i.world_size,
            i.local_rank,
            i.local_world_size
        ),
        (Launcher::Torchrun, 1, 2, 1, 2)
    );
    assert!(
        i.agent_store,
        "torchrun serves the store: TORCHELASTIC_USE_AGENT_STORE=True"
    );
    assert_eq!(i.restart_count, 0);
    assert_eq!(
        i.master,
        Some(("localhost".into(), vars["MASTER_PORT"].parse().unwrap()))
    );
    assert!(i.error_file.unwrap().ends_with("attempt_0/1/error.json"));
    assert!(!i.mpi_launch);
    // A restarted attempt reads its own keys.
    let mut again = vars.clone();
    again.insert("TORCHELASTIC_RESTART_COUNT".into(), "1".into());
    assert_eq!(info(&again).restart_count, 1);
}

#[test]
fn mpirun_is_an_mpi_launch_without_a_store_address() {
    let i = info(&recorded("openmpi-4.1.4-rank1.env"));
    assert_eq!(
        (i.launcher, i.rank, i.world_size, i.local_rank),
        (Launcher::OpenMpi, 1, 2, 1)
    );
    assert!(i.mpi_launch);
    assert_eq!(i.master, None);
    assert!(!i.agent_store);
}

#[test]
fn slurm_without_master_addr_finds_the_launch_node() {
    let vars = recorded("slurm-srun-rank5.env");
    let i = info(&vars);
    assert_eq!(
        (
            i.launcher,
            i.rank,
            i.world_size,
            i.local_rank,
            i.local_world_size
        ),
        (Launcher::Slurm, 5, 6, 2, 3)
    );
    assert_eq!(i.master, Some(("10.1.2.7".into(), 29500 + 456)));
    // Without the launch node's address: the first host of the node list.
    let mut no_ip = vars.clone();
    no_ip.remove("SLURM_LAUNCH_NODE_IPADDR");
    assert_eq!(info(&no_ip).master, Some(("gpu07".into(), 29956)));
    // MASTER_ADDR and MASTER_PORT win when set.
    let mut set = vars;
    set.insert("MASTER_ADDR".into(), "head".into());
    set.insert("MASTER_PORT".into(), "1234".into());
    assert_eq!(info(&set).master, Some(("head".into(), 1234)));
}

#[test]
fn slurm_node_lists() {
    for (list, first) in [
        ("node[01-04,07],gpu5", "node01"),
        ("a,b", "a"),
        ("gpu5", "gpu5"),
        ("rack1-[3,5-6]", "rack1-3"),
        (" x[10-12] ", "x10"),
    ] {
        assert_eq!(first_slurm_host(list).as_deref(), Some(first), "{list}");
    }
    assert_eq!(first_slurm_host(""), None);
    assert_eq!(slurm_port(Some("1999")), 30499);
    assert_eq!(slurm_port(None), 29500);
}

#[test]
fn bad_values_name_the_variable() {
    let get = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let e = LaunchInfo::from_vars(&get(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
    assert!(e.to_string().contains("RANK=4"), "{e}");
    let e = LaunchInfo::from_vars(&get(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err();
    assert!(e.to_string().contains("RANK"), "{e}");
    let e =
        LaunchInfo::from_vars(&get(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")])).unwrap_err();
    assert!(e.to_string().contains("MASTER_PORT"), "{e}");
    let e = LaunchInfo::from_vars(&get(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("TORCHELASTIC_RESTART_COUNT", "-1"),
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("TORCHELASTIC_RESTART_COUNT"), "{e}");
    assert_eq!(
        LaunchInfo::from_vars(&get(&[])).unwrap().launcher,
        Launcher::Single
    );
}

/// A local rank at the top of its integer type, or not below the local world size, and a restart
/// count too large for its field, are refused naming the variable (once a panic in checked
/// builds, and a local rank past the local world size accepted in release builds).
#[test]
fn local_ranks_and_restart_counts_out_of_range_are_refused() {
    let refused = |pairs: &[(&str, &str)], var: &str| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| LaunchInfo::from_vars(&get)));
        let e = match r {
            Ok(Ok(i)) => panic!("{pairs:?} accepted: {i:?}"),
            Ok(Err(e)) => e,
            Err(_) => panic!("{pairs:?} panicked"),
        };
        assert!(e.to_string().contains(var), "{pairs:?}: {e}");
    };
    let max = usize::MAX.to_string();
    let base = [("RANK", "0"), ("WORLD_SIZE", "4")];
    refused(
        &[base[0], base[1], ("LOCAL_RANK", max.as_str())],
        "LOCAL_RANK",
    );
    refused(
        &[
            base[0],
            base[1],
            ("LOCAL_RANK", max.as_str()),
            ("LOCAL_WORLD_SIZE", "2"),
        ],
        "LOCAL_RANK",
    );
    refused(
        &[
            base[0],
            base[1],
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ],
        "LOCAL_RANK",
    );
    refused(&[base[0], base[1], ("LOCAL_RANK", "4")], "LOCAL_RANK");
    refused(
        &[base[0], base[1], ("LOCAL_WORLD_SIZE", "0")],
        "LOCAL_WORLD_SIZE",
    );
    refused(
        &[
            base[0],
            base[1],
            ("TORCHELASTIC_RESTART_COUNT", "4294967296"),
        ],
        "TORCHELASTIC_RESTART_COUNT",
    );
    // In range: the local rank below the local world size, which may stand alone.
    let get = |k: &str| match k {
        "RANK" => Some("3".to_string()),
        "WORLD_SIZE" => Some("4".to_string()),
        "LOCAL_RANK" => Some("1".to_string()),
        _ => None,
    };
    let i = LaunchInfo::from_vars(&get).unwrap();
    assert_eq!((i.local_rank, i.local_world_size), (1, 2));
}
