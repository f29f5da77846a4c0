//! `tessera simulate --gangs --imex-racks N`: the gang trace on GB200 NVL72 racks where every gang
//! asks for one IMEX domain. The pieces the gang trace adds for it: each clique's channel pool as
//! the controller publishes it, a gang's domain claim, and the book of channels held, which refuses
//! a channel given to two live domains (the run fails: the simulation checks the rule, it does not
//! just count).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceSlice};
use serde::Serialize;
use tessera_api::imex::{IMEX_DEVICE_CLASS, clique_of_pool};
use tessera_api::names::DRIVER_NAME;
use tessera_gpu_inventory::{ChannelPool, ServerVersion, render_channel_slices};
use tessera_placement::synthetic;

/// Trays per GB200 NVL72 rack (one fabric clique each).
pub const TRAYS_PER_RACK: usize = 18;

/// The channel pool of `clique` over its `trays`, `channels` channels, topology-managed.
pub(super) fn channel_slices(
    clique: &str,
    trays: Vec<String>,
    channels: u32,
) -> anyhow::Result<Vec<ResourceSlice>> {
    render_channel_slices(&ChannelPool {
        driver: DRIVER_NAME.to_owned(),
        clique: clique.to_owned(),
        nodes: trays,
        channels,
        managed: true,
        generation: 1,
        server_version: ServerVersion::V1_35,
    })
    .with_context(|| format!("the IMEX channels of clique {clique}"))
}

/// Gang `gang`'s domain claim.
pub(super) fn domain_claim(gang: usize) -> ResourceClaim {
    synthetic::device_claim(
        "simulate",
        &format!("domain-{gang}"),
        &format!("sim-domain-{gang}"),
        IMEX_DEVICE_CLASS,
        1,
    )
}

/// The channel (clique, device) of a domain's allocation.
pub(super) fn channel_of(allocation: &AllocationResult) -> Option<(String, String)> {
    allocation
        .devices
        .as_ref()?
        .results
        .iter()
        .flatten()
        .find_map(|r| Some((clique_of_pool(&r.pool)?.to_owned(), r.device.clone())))
}

/// What the domains got in one mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImexMetrics {
    /// Gangs started with their domain's channel.
    pub domains_started: usize,
    /// Of those, percent whose pods all ran in their channel's clique.
    pub in_channel_clique_percent: f64,
    /// Most channels held at once, over the whole cluster.
    pub peak_channels_in_use: usize,
    /// Most channels held at once in one clique.
    pub peak_channels_in_one_clique: usize,
    /// Distinct channels (clique, channel) ever allocated.
    pub channels_used: usize,
    /// Gangs that waited at least one step before starting (or never started).
    pub gangs_that_waited: usize,
    /// Channels held at the end by gangs that never completed (per-pod first fit allocates the
    /// domain with the first pod).
    pub channels_held_by_incomplete: usize,
}

/// The channels held, by whom: refuses to give one to a second gang.
#[derive(Default)]
pub(super) struct ChannelBook {
    held: BTreeMap<(String, String), usize>,
    used: BTreeSet<(String, String)>,
    peak: usize,
    peak_in_clique: usize,
}

impl ChannelBook {
    /// Gang `gang` is allocated `channel`.
    pub(super) fn hold(&mut self, channel: (String, String), gang: usize) -> anyhow::Result<()> {
        if let Some(other) = self.held.get(&channel).filter(|g| **g != gang) {
            bail!(
                "channel {} of clique {} given to gang {gang} while gang {other} holds it",
                channel.1,
                channel.0
            );
        }
        let clique = channel.0.clone();
        self.used.insert(channel.clone());
        self.held.insert(channel, gang);
        self.peak = self.peak.max(self.held.len());
        let in_clique = self.held.keys().filter(|(c, _)| *c == clique).count();
        self.peak_in_clique = self.peak_in_clique.max(in_clique);
        Ok(())
    }

    /// Channels of `clique` held by the gangs `counts` admits.
    pub(super) fn held_in(&self, clique: &str, counts: impl Fn(usize) -> bool) -> usize {
        self.held
            .iter()
            .filter(|((c, _), g)| c == clique && counts(**g))
            .count()
    }

    /// Gang `gang` is gone: its channel is free.
    pub(super) fn release(&mut self, gang: usize) {
        self.held.retain(|_, g| *g != gang);
    }

    /// Metrics, with the counts the gang run keeps.
    pub(super) fn metrics(
        &self,
        started: usize,
        in_clique: usize,
        waited: usize,
        held_by_incomplete: usize,
    ) -> ImexMetrics {
        ImexMetrics {
            domains_started: started,
            in_channel_clique_percent: if started == 0 {
                0.0
            } else {
                super::stats::round2(100.0 * in_clique as f64 / started as f64)
            },
            peak_channels_in_use: self.peak,
            peak_channels_in_one_clique: self.peak_in_clique,
            channels_used: self.used.len(),
            gangs_that_waited: waited,
            channels_held_by_incomplete: held_by_incomplete,
        }
    }
}

/// The domains' table, after the gang table.
pub(super) fn write_table(
    out: &mut impl std::io::Write,
    channels: u32,
    modes: [(&str, Option<&ImexMetrics>); 2],
) -> anyhow::Result<()> {
    writeln!(
        out,
        "\nIMEX domains (every gang asks for one; {channels} channels per clique):\n"
    )?;
    writeln!(
        out,
        "| mode | started with a channel | in the channel's clique % | peak channels in use (one clique) | channels used | gangs that waited | channels held by incomplete gangs |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (name, metrics) in modes {
        let Some(i) = metrics else { continue };
        writeln!(
            out,
            "| {name} | {} | {} | {} ({}) | {} | {} | {} |",
            i.domains_started,
            i.in_channel_clique_percent,
            i.peak_channels_in_use,
            i.peak_channels_in_one_clique,
            i.channels_used,
            i.gangs_that_waited,
            i.channels_held_by_incomplete
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_goes_to_one_live_gang_and_again_after_release() {
        let mut book = ChannelBook::default();
        let c0 = ("u.1".to_owned(), "channel-0".to_owned());
        let c1 = ("u.2".to_owned(), "channel-0".to_owned());
        book.hold(c0.clone(), 1).unwrap();
        book.hold(c0.clone(), 1).unwrap();
        book.hold(c1, 2).unwrap();
        let refused = book.hold(c0.clone(), 3).unwrap_err().to_string();
        assert_eq!(
            refused,
            "channel channel-0 of clique u.1 given to gang 3 while gang 1 holds it"
        );
        book.release(1);
        book.hold(c0, 3).unwrap();
        let m = book.metrics(3, 3, 1, 0);
        assert_eq!(m.peak_channels_in_use, 2);
        assert_eq!(m.peak_channels_in_one_clique, 1);
        assert_eq!(m.channels_used, 2);
        assert_eq!(m.in_channel_clique_percent, 100.0);
    }
}
