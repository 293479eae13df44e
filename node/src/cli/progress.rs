//! `ctrl deploy --wait`'s progress bars: one per region, running over
//! desired instances, moved by the views `node::wait::until_ready` hands
//! its callback, finished when the deployment ends.

use std::collections::BTreeMap;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use wire::model::DeploymentStatus;
use wire::operator::DeploymentView;

/// The bars of one deployment's regions.
pub(crate) struct RegionBars {
    bars: MultiProgress,
    style: ProgressStyle,
    by_region: BTreeMap<String, ProgressBar>,
}

impl RegionBars {
    /// Bars drawn on `draw` (`ProgressDrawTarget::hidden()` for none).
    pub(crate) fn new(draw: ProgressDrawTarget) -> Self {
        let style =
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} running {msg}")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        RegionBars {
            bars: MultiProgress::with_draw_target(draw),
            style,
            by_region: BTreeMap::new(),
        }
    }

    /// Moves each region's bar to what `view` shows; finishes them when
    /// the deployment is ready and abandons them when it ended otherwise.
    pub(crate) fn show(&mut self, view: &DeploymentView) {
        let d = &view.deployment;
        for region in &d.regions {
            let bar = self.by_region.entry(region.clone()).or_insert_with(|| {
                let bar = self.bars.add(ProgressBar::new(u64::from(d.replicas)));
                bar.set_style(self.style.clone());
                bar.set_prefix(region.clone());
                bar
            });
            bar.set_position(node::wait::running(view, region) as u64);
        }
        match d.status {
            DeploymentStatus::Ready => {
                self.by_region
                    .values()
                    .for_each(|b| b.finish_with_message("ready"));
            }
            DeploymentStatus::Failed
            | DeploymentStatus::Stopped
            | DeploymentStatus::Cancelled
            | DeploymentStatus::Superseded => {
                self.by_region.values().for_each(ProgressBar::abandon);
            }
            DeploymentStatus::Pending
            | DeploymentStatus::Deploying
            | DeploymentStatus::Network
            | DeploymentStatus::Finalizing => {}
        }
    }
}

impl Drop for RegionBars {
    /// A wait that timed out or failed leaves its bars where they stood.
    fn drop(&mut self) {
        self.by_region
            .values()
            .filter(|b| !b.is_finished())
            .for_each(ProgressBar::abandon);
    }
}
