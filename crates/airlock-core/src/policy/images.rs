//! `[images]`: the local image store and its rebuild schedule.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The local image store (`airlock image ...`) and the rebuild schedule of its images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesPolicy {
    /// The store's directory, absolute; empty: `images` under airlock's state directory.
    /// Its parent directories must be searchable by all (the sandbox binds trees from it).
    pub store: PathBuf,
    /// `airlock doctor` warns when an image in use was made longer ago than this.
    pub rebuild_age_days: u32,
}

impl ImagesPolicy {
    /// Longest rebuild age a policy may set.
    pub const REBUILD_AGE_MAX_DAYS: u32 = 3650;

    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.store.as_os_str().is_empty() && !self.store.is_absolute() {
            return Err((
                "store",
                format!(
                    "{} is not an absolute path (leave it empty for the default)",
                    self.store.display()
                ),
            ));
        }
        if self.store.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(("store", "contains a NUL byte".to_owned()));
        }
        if self.rebuild_age_days == 0 || self.rebuild_age_days > Self::REBUILD_AGE_MAX_DAYS {
            return Err((
                "rebuild_age_days",
                format!("must be between 1 and {}", Self::REBUILD_AGE_MAX_DAYS),
            ));
        }
        Ok(())
    }
}

impl Default for ImagesPolicy {
    fn default() -> Self {
        Self {
            store: PathBuf::new(),
            rebuild_age_days: 30,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use pretty_assertions::assert_eq;

    #[test]
    fn images_section_takes_defaults_and_is_checked() {
        let p = Policy::builtin();
        assert_eq!(p.images.store, PathBuf::new());
        assert_eq!(p.images.rebuild_age_days, 30);
        let p = Policy::from_toml(
            "version = \"t\"\n[images]\nstore = \"/srv/images\"\nrebuild_age_days = 7\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.images.store, PathBuf::from("/srv/images"));
        assert_eq!(p.images.rebuild_age_days, 7);
        for bad in [
            "[images]\nstore = \"relative\"",
            "[images]\nrebuild_age_days = 0",
            "[images]\nrebuild_age_days = 100000",
            "[images]\nmax_age = 3",
        ] {
            let text = format!("version = \"t\"\n{bad}\n");
            assert!(Policy::from_toml(&text, "t").is_err(), "accepted: {bad}");
        }
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again.images, p.images);
    }
}
