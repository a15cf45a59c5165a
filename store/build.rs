//! Lists `migrations/*.sql` for the migrator (`src/lib.rs`), in version order, so adding a
//! migration is adding its file. A file named otherwise than `<version>_<words>.sql`, or two
//! files of one version, fail the build.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

fn main() -> Result<(), Box<dyn Error>> {
    let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR")?).join("migrations");
    // A file added or removed changes the folder; a file's edit is tracked by include_str!.
    println!("cargo::rerun-if-changed={}", dir.display());
    let mut migrations = BTreeMap::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "sql") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("{}: not a UTF-8 name", path.display()))?;
        let (version, words) = stem
            .split_once('_')
            .ok_or_else(|| format!("{}: not <version>_<words>.sql", path.display()))?;
        let version: i64 = version
            .parse()
            .map_err(|_| format!("{}: the version is not a number", path.display()))?;
        let description = words.replace('_', " ");
        if let Some((_, other)) = migrations.insert(version, (description, path.clone())) {
            return Err(format!("{} and {}: one version", path.display(), other.display()).into());
        }
    }
    let mut listed = String::from("&[\n");
    for (version, (description, path)) in &migrations {
        let path = path.to_str().ok_or("a migration's path is not UTF-8")?;
        writeln!(
            listed,
            "    ({version}, {description:?}, include_str!({path:?})),"
        )?;
    }
    listed.push(']');
    let out = Path::new(&std::env::var("OUT_DIR")?).join("migrations.rs");
    std::fs::write(out, listed)?;
    Ok(())
}
