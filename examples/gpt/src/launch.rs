//! One rank per process: the launcher's variables say who this process is (torchrun's `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`/`MASTER_PORT`, or `mpirun`'s), the rank drives device
//! `LOCAL_RANK` of the backend, and the world communicator comes from unihal's bootstrap: the
//! MPI engine's own world under `mpirun`, else a unique id through the job's c10d store
//! (torchrun's agent store, or rank 0's). A failing rank writes torchrun's error file.

use crate::data::Corpus;
use crate::train::{train_rank, Report, StepStats, TrainConfig};
use crate::Error;
use unihal::bootstrap::{init_world, report_failure, LaunchInfo};
use unihal::{Backend, CommConfig};

/// This process's launch, when a launcher started more than one process.
///
/// # Errors
/// Malformed launcher variables.
pub fn multi_process() -> Result<Option<LaunchInfo>, Error> {
    let info = LaunchInfo::from_env().map_err(Error::hal("launcher variables"))?;
    Ok((info.world_size > 1).then_some(info))
}

/// Trains as this process's rank of the launched job; every process of the job calls it with the
/// same configuration. Returns rank 0's report on rank 0 (the others report their own steps).
///
/// # Errors
/// The bootstrap's (a missing `MASTER_ADDR`, ranks that never arrive: `Timeout`) and the run's.
pub fn train_process(
    backend: &dyn Backend,
    info: &LaunchInfo,
    corpus: &Corpus,
    cfg: &TrainConfig,
    on_step: &(dyn Fn(&StepStats) + Sync),
) -> Result<Report, Error> {
    let have = backend.probe().map_err(Error::hal("probe"))?;
    if have == 0 {
        return Err(Error::Config(format!(
            "backend {} has no device",
            backend.name()
        )));
    }
    let dev = backend
        .open(info.local_rank % have)
        .map_err(Error::hal("open"))?;
    let (comm, _store) = match init_world(backend, &dev, info, &CommConfig::default()) {
        Ok(w) => w,
        Err(e) => {
            report_failure(info, &e);
            return Err(Error::hal("bootstrap")(e));
        }
    };
    let r = train_rank(backend, dev, Some(comm.clone()), corpus, cfg, on_step);
    if let Err(e) = &r {
        report_failure(info, e);
        comm.abort();
    }
    r
}
