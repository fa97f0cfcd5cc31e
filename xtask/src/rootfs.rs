//! `cargo xtask rootfs`: build the sandbox's root filesystem image. A front end over the
//! `codecage-image` crate's `rootfs` module (which `codecage image` uses too), with the
//! recipes of this workspace's `rootfs/` directory.

use crate::host::workspace_root;
use anyhow::Result;
use codecage_image::rootfs::{self, DEFAULT_RECIPE, ENVIRONMENT};
use std::path::PathBuf;

/// Build the sandbox's root filesystem image (root; instant when up to date)
///
/// Builds the image of the recipe in rootfs/NAME/: Debian bookworm packages (mmdebstrap),
/// pinned PyPI packages (pip) and npm packages (npm ci), then a smoke test as uid 1000 on
/// a read-only root. Needs root (mmdebstrap, chroot, mounts in a private mount namespace).
/// Instant when the image of the current recipe exists already.
///
/// The image goes to OUT/NAME-HASH (HASH: 12 hex digits of the recipe hash) and OUT/NAME
/// is a symlink switched to it atomically; its manifest is in the image at
/// /usr/share/codecage/manifest.json and beside it at OUT/NAME-HASH.manifest.json.
#[derive(clap::Args, Debug)]
#[command(
    verbatim_doc_comment,
    override_usage = "cargo xtask rootfs [--recipe NAME] [--out DIR] [--force] [--verbose]\n       \
                      cargo xtask rootfs --verify [--recipe NAME] [--out DIR]",
    after_long_help = ENVIRONMENT
)]
pub struct Args {
    /// The recipe, a directory under rootfs/
    #[arg(
        long,
        value_name = "NAME",
        default_value = DEFAULT_RECIPE,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    recipe: String,
    /// Where images live
    ///
    /// Default: $CODECAGE_DATA_DIR/rootfs, else /var/lib/codecage/rootfs.
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    out: Option<PathBuf>,
    /// Rebuild even if the image of the current recipe exists
    #[arg(long)]
    force: bool,
    /// Stream the tools' output
    ///
    /// Otherwise it goes to the build log only, and is shown when a step fails.
    #[arg(short, long)]
    verbose: bool,
    /// Check the image against its manifest (builds nothing)
    ///
    /// Recomputes the content hash of the image OUT/NAME points to and compares it with the
    /// one in its manifest.
    #[arg(long)]
    verify: bool,
}

impl Default for Args {
    /// The default recipe into the default place: what `cargo xtask rootfs` builds.
    fn default() -> Args {
        Args {
            recipe: DEFAULT_RECIPE.to_string(),
            out: None,
            force: false,
            verbose: false,
            verify: false,
        }
    }
}

impl Args {
    /// `--out`, else `$CODECAGE_DATA_DIR/rootfs`, else `/var/lib/codecage/rootfs`.
    fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(rootfs::default_out)
    }
}

fn non_empty_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("a directory is needed".to_string());
    }
    Ok(PathBuf::from(s))
}

/// `cargo xtask rootfs`: the exit status, or an error to report.
pub fn rootfs(args: &Args) -> Result<i32> {
    let out = args.out();
    if args.verify {
        let hint = format!("cargo xtask rootfs --recipe {}", args.recipe);
        rootfs::verify(&out, &args.recipe, &hint)?;
        return Ok(0);
    }
    rootfs::build(&rootfs::BuildRequest {
        recipe: &args.recipe,
        recipes: &[workspace_root().join("rootfs")],
        out: &out,
        force: args.force,
        verbose: args.verbose,
        program: "cargo xtask",
    })?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        match crate::tests::parse(&[&["rootfs"], args].concat())? {
            crate::Task::Rootfs(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_arguments() {
        let o = parse(&["--recipe", "x", "--out=/o", "--force", "-v"]).unwrap();
        assert_eq!(o.recipe, "x");
        assert_eq!(o.out(), PathBuf::from("/o"));
        assert!(o.force && o.verbose && !o.verify);
        let d = parse(&[]).unwrap();
        assert_eq!(d.recipe, Args::default().recipe);
        assert!(parse(&["--verify"]).unwrap().verify);
        for bad in [
            &["--recipe"][..],
            &["--recipe="],
            &["--out="],
            &["--bogus"],
            &["x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
