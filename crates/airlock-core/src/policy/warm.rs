//! The warm pool settings the backends' sections share (`[native]`, `[docker]`): the
//! bounds of a pool, of its idle lifetime, and the language it starts ahead of jobs.

use std::collections::BTreeMap;
use std::time::Duration;

use super::LanguageSpec;

/// The largest warm pool (each warm sandbox holds an interpreter's memory).
pub const WARM_POOL_MAX: u32 = 64;
/// The shortest idle lifetime: below it the pool would spend its time restarting.
pub const WARM_IDLE_MIN: Duration = Duration::from_secs(1);
/// The longest idle lifetime.
pub const WARM_IDLE_MAX: Duration = Duration::from_secs(24 * 3600);

/// Checks a section's warm settings: each named pool size (`(field, size)`), the idle
/// lifetime, and, when any pool is on, that `language` is in `languages` with a Python
/// interpreter whose last argument is the source file (the bootstrap replaces it).
/// Returns the field name and reason.
pub(super) fn check_warm(
    sizes: &[(&'static str, u32)],
    idle: Duration,
    language: &str,
    languages: &BTreeMap<String, LanguageSpec>,
) -> Result<(), (&'static str, String)> {
    for (field, size) in sizes {
        if *size > WARM_POOL_MAX {
            return Err((field, format!("must be at most {WARM_POOL_MAX}")));
        }
    }
    if !(WARM_IDLE_MIN..=WARM_IDLE_MAX).contains(&idle) {
        return Err((
            "warm_idle",
            format!(
                "must be between {}s and {}s",
                WARM_IDLE_MIN.as_secs(),
                WARM_IDLE_MAX.as_secs()
            ),
        ));
    }
    if sizes.iter().any(|(_, size)| *size > 0) {
        let python = languages.get(language).is_some_and(|l| {
            let program = l.command[0].rsplit('/').next().unwrap_or_default();
            program.starts_with("python")
                && l.command.last().map(String::as_str) == Some(LanguageSpec::FILE_PLACEHOLDER)
                && l.command
                    .iter()
                    .filter(|a| a.contains(LanguageSpec::FILE_PLACEHOLDER))
                    .count()
                    == 1
        });
        if !python {
            return Err((
                "warm_language",
                format!(
                    "{language:?} must be a language whose command is a Python interpreter with \
                     {} as its last argument (warm sandboxes start Python ahead of the job)",
                    LanguageSpec::FILE_PLACEHOLDER
                ),
            ));
        }
    }
    Ok(())
}
