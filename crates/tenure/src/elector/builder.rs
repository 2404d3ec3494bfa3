//! Building an elector: the settings, the presence candidate, the slots.

use super::*;

pub(super) type ConfigEdit = Box<dyn FnOnce(&mut Config) + Send>;

/// Builds an [`Elector`]; see [`Elector::builder`].
pub struct ElectorBuilder {
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) election: Result<ElectionName, NameError>,
    pub(super) holder: Option<Result<HolderId, NameError>>,
    pub(super) ttl: Duration,
    pub(super) edits: Vec<ConfigEdit>,
    pub(super) clock: Arc<dyn Clock>,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $t:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $t) -> Self {
            self.edits.push(Box::new(move |c: &mut Config| c.$name = value));
            self
        }
    };
}

impl ElectorBuilder {
    /// The lease TTL; every other interval defaults to a fraction of it (see [`Config::new`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// This candidate's id (default [`HolderId::generate`]). An id names one candidate at
    /// a time: shut a candidate down before building another with the same id, since a
    /// store takes a record of the same holder for the same candidate's (its own live
    /// lease is a renewal to it, and a stopping candidate releases it). For a name that
    /// other processes may also be given, pass [`HolderId::instance_of`]`(name)`.
    pub fn holder(mut self, holder: impl AsRef<str>) -> Self {
        self.holder = Some(HolderId::new(holder));
        self
    }

    /// The clock (default tokio's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces every setting at once (the TTL included).
    pub fn config(mut self, config: Config) -> Self {
        self.ttl = config.ttl;
        self.edits.push(Box::new(move |c: &mut Config| *c = config));
        self
    }

    setter!(/// See [`Config::renew_interval`].
        renew_interval: Duration);
    setter!(/// See [`Config::renew_deadline`].
        renew_deadline: Duration);
    setter!(/// See [`Config::retry_period`].
        retry_period: Duration);
    setter!(/// See [`Config::request_timeout`].
        request_timeout: Duration);
    setter!(/// See [`Config::max_drift`].
        max_drift: f64);
    setter!(/// See [`Config::safety_margin`].
        safety_margin: Duration);
    setter!(/// See [`Config::cool_down`].
        cool_down: Duration);
    setter!(/// See [`Config::jitter`].
        jitter: f64);
    setter!(/// See [`Config::splay`].
        splay: Duration);
    setter!(/// See [`Config::resign_backoff`].
        resign_backoff: Duration);
    setter!(/// See [`Config::metadata`].
        metadata: Vec<u8>);
    setter!(/// See [`Config::announce`].
        announce: bool);
    setter!(/// See [`Config::priority`].
        priority: i32);
    setter!(/// See [`Config::holders`].
        holders: u32);

    /// Validates the settings and builds the elector. It does not campaign until
    /// [`Elector::start`] (or a method that waits for leadership) is called.
    pub fn build(self) -> Result<Elector, BuildError> {
        let election = self.election?;
        let holder = self.holder.unwrap_or_else(|| Ok(HolderId::generate()))?;
        let mut cfg = Config::new(self.ttl);
        for edit in self.edits {
            edit(&mut cfg);
        }
        cfg.validate()?;
        let slots = slot_requests(&election, &holder, &cfg)?;
        // The presence lease: a candidate of its own, in an election nobody else enters.
        let presence = match cfg.announce {
            true => Some(
                Elector::builder(self.store.clone(), crate::presence::name(&election, &holder).as_str())
                    .holder(holder.as_str())
                    .ttl(cfg.ttl)
                    .clock(self.clock.clone())
                    .metadata(crate::presence::encode(cfg.priority, None, &cfg.metadata))
                    .build()?,
            ),
            false => None,
        };
        let shutdown = CancellationToken::new();
        let metrics = crate::metrics::ElectorMetrics::new(election.as_str());
        let shared = Arc::new(Shared {
            metrics,
            store: self.store,
            req: AcquireRequest { election, holder, ttl: cfg.ttl, metadata: cfg.metadata.clone() },
            slots,
            cfg,
            clock: self.clock,
            events: OnceLock::new(),
            leadership: Published::default(),
            shutdown: shutdown.clone(),
            stopped: Default::default(),
            task: Mutex::new(None),
            failure: Mutex::new(None),
            presence,
            kinds_checked: Default::default(),
        });
        Ok(Elector { shared, _guard: Arc::new(shutdown.drop_guard()) })
    }
}

/// The acquire request of each slot of an election with several holders; none with one.
pub(super) fn slot_requests(
    election: &ElectionName,
    holder: &HolderId,
    cfg: &Config,
) -> Result<Vec<AcquireRequest>, BuildError> {
    if cfg.holders <= 1 {
        return Ok(Vec::new());
    }
    if election.as_str().len() > crate::holders::MAX_HOLDERS_NAME {
        return Err(BuildError::Config(ConfigError {
            setting: "holders",
            reason: format!(
                "an election with several holders has a name of at most {} characters; {election} has {}",
                crate::holders::MAX_HOLDERS_NAME,
                election.as_str().len()
            ),
        }));
    }
    // The planted bug: one slot more than asked for, so that N + 1 hold at once.
    #[cfg(feature = "mutants")]
    let extra = cfg.mutation_extra_holder || crate::mutant("holders-one-extra");
    #[cfg(not(feature = "mutants"))]
    let extra = false;
    let n = if extra { cfg.holders + 1 } else { cfg.holders };
    (0..n)
        .map(|i| {
            Ok(AcquireRequest::new(crate::holders::slot_name(election, i)?, holder.clone(), cfg.ttl)
                .with_metadata(cfg.metadata.clone()))
        })
        .collect()
}
