//! `[languages]`: how each language's source is run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a language's source is run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageSpec {
    /// argv; `{file}` is replaced with the source's path inside the sandbox.
    pub command: Vec<String>,
    /// The source's file name under `/work`.
    pub file: String,
}

impl LanguageSpec {
    /// The placeholder replaced with the source path.
    pub const FILE_PLACEHOLDER: &'static str = "{file}";

    fn check(&self) -> Result<(), String> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err("command must not be empty".to_owned());
        }
        if !self
            .command
            .iter()
            .any(|a| a.contains(Self::FILE_PLACEHOLDER))
        {
            return Err(format!(
                "command must contain {} (where the source goes)",
                Self::FILE_PLACEHOLDER
            ));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err("command contains a NUL byte".to_owned());
        }
        crate::job::check_file_name(&self.file).map_err(|r| format!("file: {r}"))?;
        Ok(())
    }
}

/// Checks the language table: not empty, names `[a-z0-9_-]`, each spec well-formed. Returns
/// the full field name (`languages` or `languages.NAME`) and reason.
pub(super) fn check_languages(
    languages: &BTreeMap<String, LanguageSpec>,
) -> Result<(), (String, String)> {
    if languages.is_empty() {
        return Err(("languages".to_owned(), "no language is defined".to_owned()));
    }
    for (name, spec) in languages {
        let field = format!("languages.{name}");
        if !is_identifier(name) {
            return Err((field, "name must be [a-z0-9_-]".to_owned()));
        }
        spec.check().map_err(|reason| (field, reason))?;
    }
    Ok(())
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn language(command: &[&str], file: &str) -> LanguageSpec {
    LanguageSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        file: file.to_owned(),
    }
}

/// The languages of the built-in policy.
pub fn builtin_languages() -> BTreeMap<String, LanguageSpec> {
    BTreeMap::from([
        // `-E -s` is `-I` without `-P`: no PYTHON* variables, no user site, and the
        // script's directory, /work, on sys.path, so the job's input files import; `-B`:
        // importing them leaves no `__pycache__` in /work.
        (
            "python".to_owned(),
            language(
                &["python3", "-B", "-E", "-s", "-u", "{file}"],
                ".airlock-main.py",
            ),
        ),
        (
            "node".to_owned(),
            language(&["node", "{file}"], ".airlock-main.js"),
        ),
        (
            "bash".to_owned(),
            language(&["bash", "{file}"], ".airlock-main.sh"),
        ),
        (
            "sh".to_owned(),
            language(&["sh", "{file}"], ".airlock-main.sh"),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use crate::policy::Policy;
    use pretty_assertions::assert_eq;

    #[test]
    fn languages_table_replaces_the_built_in_set() {
        let p = Policy::from_toml(
            "version = \"t\"\n[languages.python]\ncommand = [\"python3\", \"{file}\"]\nfile = \"m.py\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.languages.keys().collect::<Vec<_>>(), vec!["python"]);
    }
}
