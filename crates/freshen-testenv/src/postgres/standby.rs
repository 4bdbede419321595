//! A streaming standby of a [`PgServer`]: a copy of its cluster that replays its WAL,
//! for tests of decoding on a standby, failover slots and promotion.

use std::fs;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use super::{PgServer, PgServerBuilder};
use crate::TestEnvError;
use crate::support;

impl PgServer {
    /// Starts a hot standby of this server, streaming from it through a physical slot of
    /// its own on this server ([`standby_slot`](Self::standby_slot)), with
    /// `hot_standby_feedback` on (what decoding on a standby needs) and a `dbname` in its
    /// `primary_conninfo` (what slot synchronization needs). `options` adds settings
    /// (e.g. `sync_replication_slots`); its password and TLS are this server's.
    ///
    /// The standby is a copy of this server's data directory taken while it is stopped
    /// (a fast shutdown and a start again, about a second): the matrix's builds ship no
    /// `pg_basebackup`, and a copy of a cleanly stopped cluster is a base backup of
    /// every version. Clients of this server are disconnected by it: start standbys
    /// before anything else connects. Returns once the standby streams.
    pub fn start_standby(&mut self, options: PgServerBuilder) -> Result<PgServer, TestEnvError> {
        self.standbys += 1;
        let slot = format!("freshen_standby_{}", self.standbys);
        self.psql(&format!(
            "SELECT 1 FROM pg_create_physical_replication_slot('{slot}', true)"
        ))?;
        self.stop()?;
        let dir = support::private_dir("freshen-pg-", &self.run_as)?;
        let copied = support::copy_tree(&self.data_path(), &dir.path().join("data"), &self.run_as);
        self.start_again()?;
        copied?;
        let sock = dir.path().join("s");
        fs::create_dir(&sock).map_err(|e| TestEnvError::io("creating the socket directory", e))?;
        self.run_as.own(&sock)?;
        let data = dir.path().join("data");
        for stale in ["postmaster.pid", "postmaster.opts"] {
            let _ = fs::remove_file(data.join(stale));
        }
        let signal = data.join("standby.signal");
        fs::write(&signal, "").map_err(|e| TestEnvError::io("writing standby.signal", e))?;
        self.run_as.own(&signal)?;

        let mut conninfo = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres application_name={slot}",
            self.port
        );
        if let Some(pw) = &self.options.password {
            conninfo.push_str(&format!(" password={}", conninfo_quote(pw)));
        }
        // In postgresql.auto.conf, not on the command line (which would outrank ALTER
        // SYSTEM): hold_wal_receiver empties primary_conninfo with a reload.
        let auto = data.join("postgresql.auto.conf");
        let mut text = fs::read_to_string(&auto).unwrap_or_default();
        text.push_str(&format!(
            "primary_conninfo = {}\nprimary_slot_name = '{slot}'\n",
            sql_quote(&conninfo)
        ));
        fs::write(&auto, text).map_err(|e| TestEnvError::io("writing postgresql.auto.conf", e))?;
        self.run_as.own(&auto)?;
        let mut settings = vec![
            ("hot_standby".to_string(), "on".to_string()),
            ("hot_standby_feedback".to_string(), "on".to_string()),
            // A test promotes or reads at once; the default 10 s would make the primary
            // see the standby's progress late.
            ("wal_receiver_status_interval".to_string(), "1s".to_string()),
        ];
        settings.extend(options.settings);
        let mut standby = PgServer {
            bins: self.bins.clone(),
            run_as: self.run_as.clone(),
            dir,
            port: 0,
            options: PgServerBuilder {
                settings,
                password: self.options.password.clone(),
                tls: self.options.tls,
                own_cluster: false,
                version: Some(self.bins.major),
                detached: self.options.detached,
            },
            child: None,
            standbys: 0,
            slot: Some(slot),
        };
        if standby.options.tls {
            // The copy holds no tls/ directory: it lives beside the data directory.
            standby.make_certificates()?;
        }
        standby.spawn_on_free_port()?;
        let streaming = support::wait_for(Duration::from_secs(60), || {
            let n = standby
                .psql("SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'")
                .ok()?;
            (n == "1").then_some(())
        });
        if streaming.is_none() {
            return Err(TestEnvError::StartFailed {
                reason: "the standby did not stream from its primary within 60 s".into(),
                log: support::tail(&standby.log_path(), 30),
            });
        }
        Ok(standby)
    }

    /// Names `standby`'s slot in this primary's `synchronized_standby_slots`
    /// (PostgreSQL 17): logical walsenders send nothing the standby has not flushed,
    /// and it is one of the standbys that keep failover slots in step.
    pub fn synchronize_with(&self, standby: &PgServer) -> Result<(), TestEnvError> {
        let slot = standby
            .standby_slot()
            .ok_or_else(|| TestEnvError::Command {
                command: "synchronized_standby_slots".into(),
                output: "not a standby of this server".into(),
            })?;
        self.psql(&format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{slot}'"
        ))?;
        self.psql("SELECT pg_reload_conf()")?;
        Ok(())
    }

    /// The physical slot on the primary this standby streams through (`None` for a
    /// server that is no standby): what `synchronized_standby_slots` names.
    pub fn standby_slot(&self) -> Option<&str> {
        self.slot.as_deref()
    }

    /// Whether the server is in recovery (a standby not yet promoted).
    pub fn in_recovery(&self) -> Result<bool, TestEnvError> {
        Ok(self.psql("SELECT pg_is_in_recovery()")? == "t")
    }

    /// Promotes a standby and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), TestEnvError> {
        let out = self.psql("SELECT pg_promote(true, 60)")?;
        if out != "t" {
            return Err(TestEnvError::Command {
                command: "SELECT pg_promote(true, 60)".into(),
                output: format!("{out} (not promoted within 60 s)"),
            });
        }
        Ok(())
    }

    /// Stops a standby's WAL receiver and keeps it stopped (its `primary_conninfo`
    /// emptied; a reload), so the primary's later WAL does not reach it:
    /// [`resume_wal_receiver`](Self::resume_wal_receiver) undoes it. Returns once no
    /// receiver runs.
    pub fn hold_wal_receiver(&self) -> Result<(), TestEnvError> {
        self.psql("ALTER SYSTEM SET primary_conninfo = ''")?;
        self.psql("SELECT pg_reload_conf()")?;
        let stopped = support::wait_for(Duration::from_secs(30), || {
            let n = self
                .psql("SELECT count(*) FROM pg_stat_wal_receiver")
                .ok()?;
            (n == "0").then_some(())
        });
        stopped.ok_or_else(|| TestEnvError::StartFailed {
            reason: "the standby's WAL receiver did not stop within 30 s".into(),
            log: support::tail(&self.log_path(), 30),
        })
    }

    /// Lets a standby's WAL receiver stream again after
    /// [`hold_wal_receiver`](Self::hold_wal_receiver).
    pub fn resume_wal_receiver(&self) -> Result<(), TestEnvError> {
        self.psql("ALTER SYSTEM RESET primary_conninfo")?;
        self.psql("SELECT pg_reload_conf()")?;
        Ok(())
    }
}

impl PgServer {
    /// The pid of a standby's WAL receiver.
    fn wal_receiver_pid(&self) -> Result<i32, TestEnvError> {
        let out = self.psql("SELECT pid FROM pg_stat_wal_receiver")?;
        out.trim().parse().map_err(|_| TestEnvError::Command {
            command: "SELECT pid FROM pg_stat_wal_receiver".into(),
            output: format!("no WAL receiver runs ({out:?})"),
        })
    }

    /// Freezes a standby's WAL receiver (SIGSTOP) where it is: the primary's later WAL
    /// stays unread (in the socket, or not sent), while the standby's other processes
    /// — slot synchronization among them — go on. [`crash_wal_receiver`](Self::crash_wal_receiver)
    /// then drops what it had not written.
    pub fn freeze_wal_receiver(&self) -> Result<(), TestEnvError> {
        let pid = self.wal_receiver_pid()?;
        signal(pid, Signal::STOP)
    }

    /// Kills a standby's WAL receiver (SIGKILL, after [`freeze_wal_receiver`](Self::freeze_wal_receiver)):
    /// WAL it had received but not written is gone, as in a crash of the standby's
    /// host. The server restarts its processes (crash recovery, in recovery still);
    /// returns once it accepts connections again.
    pub fn crash_wal_receiver(&self) -> Result<(), TestEnvError> {
        let pid = self.wal_receiver_pid()?;
        signal(pid, Signal::KILL)?;
        let back = support::wait_for(Duration::from_secs(60), || {
            let gone = self
                .psql(&format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
                ))
                .ok()?;
            (gone == "0" && self.in_recovery().ok()?).then_some(())
        });
        back.ok_or_else(|| TestEnvError::StartFailed {
            reason: "the standby did not come back after its WAL receiver was killed".into(),
            log: support::tail(&self.log_path(), 30),
        })
    }
}

fn signal(pid: i32, signal: Signal) -> Result<(), TestEnvError> {
    let pid = Pid::from_raw(pid).ok_or_else(|| TestEnvError::Command {
        command: "kill".into(),
        output: format!("not a process id: {pid}"),
    })?;
    rustix::process::kill_process(pid, signal)
        .map_err(|e| TestEnvError::io(format!("signalling process {pid:?}"), e.into()))
}

/// A configuration-file string value.
fn sql_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A libpq connection-string value, single-quoted.
fn conninfo_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}
