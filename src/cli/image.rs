//! `codecage image`: the root filesystem images sandboxes run in (`--rootfs NAME`,
//! `rootfs = "NAME"` in a profile). The codecage-image crate does the work, the same code
//! as `cargo xtask rootfs`; this parses and prints.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use codecage_image::rootfs;

/// Build, list and verify the root filesystem images sandboxes run in.
///
/// An image is built from a recipe, a directory NAME/ holding packages.txt (Debian
/// packages) and optionally requirements.txt (pinned PyPI packages), package.json with
/// package-lock.json (npm packages) and check.sh (a smoke test). Recipes are looked up in
/// --recipes DIR, then /etc/codecage/recipes (the operator's own), then
/// /usr/share/codecage/recipes (the packaged ones), then the rootfs/ directory of a
/// source checkout holding this binary or the current directory.
///
/// Images live in OUT (--out, else $CODECAGE_DATA_DIR/rootfs, else
/// /var/lib/codecage/rootfs): OUT/NAME-HASH, HASH being 12 hex digits of the recipe hash,
/// its manifest beside it at OUT/NAME-HASH.manifest.json, and OUT/NAME a symlink to the
/// current one.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub(crate) struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand)]
enum ImageCommand {
    Build(BuildArgs),
    List(ListArgs),
    Verify(VerifyArgs),
}

/// Build the image of a recipe (root; instant when it is up to date).
///
/// Debian bookworm packages (mmdebstrap), pinned PyPI packages (pip) and npm packages
/// (npm ci), then the recipe's smoke test as uid 1000 on a read-only root. Needs root
/// (mmdebstrap, chroot, mounts in a private mount namespace) and the network to a Debian
/// mirror, PyPI and the npm registry. When OUT/NAME-HASH of the current recipe exists and
/// OUT/NAME points to it, nothing is built ("up to date").
///
/// The new image goes to OUT/NAME-HASH and OUT/NAME is switched to it atomically; the
/// previous image of the recipe is kept, older ones are removed.
#[derive(Args)]
#[command(verbatim_doc_comment, after_long_help = rootfs::ENVIRONMENT)]
struct BuildArgs {
    /// The recipe.
    #[arg(value_name = "RECIPE", default_value = rootfs::DEFAULT_RECIPE)]
    recipe: String,
    /// Where images live [default: $CODECAGE_DATA_DIR/rootfs, else /var/lib/codecage/rootfs].
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    out: Option<PathBuf>,
    /// A directory of recipes, searched first.
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    recipes: Option<PathBuf>,
    /// Rebuild even if the image of the current recipe exists.
    #[arg(long)]
    force: bool,
    /// Stream the tools' output (otherwise it is in the build log, and shown when a step
    /// fails).
    #[arg(short, long)]
    verbose: bool,
}

/// List the images: recipe, hash, size, build date, path; `*` marks the one OUT/NAME
/// points to.
#[derive(Args)]
struct ListArgs {
    /// Where images live [default: $CODECAGE_DATA_DIR/rootfs, else /var/lib/codecage/rootfs].
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    out: Option<PathBuf>,
    /// Print one JSON object: {"out": DIR, "images": [...]}.
    #[arg(long)]
    json: bool,
}

/// Check an image against its manifest (builds nothing).
///
/// Recomputes the content hash of the image OUT/NAME points to (every entry's path, type,
/// mode, owner and contents) and compares it with its manifest's. On a difference, exits
/// with 1 and names the entries changed since the image was installed.
#[derive(Args)]
#[command(verbatim_doc_comment)]
struct VerifyArgs {
    /// The image's name (its recipe's).
    #[arg(value_name = "NAME", default_value = rootfs::DEFAULT_RECIPE)]
    name: String,
    /// Where images live [default: $CODECAGE_DATA_DIR/rootfs, else /var/lib/codecage/rootfs].
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    out: Option<PathBuf>,
}

fn non_empty_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("a directory is needed".to_string());
    }
    Ok(PathBuf::from(s))
}

fn out_dir(out: Option<PathBuf>) -> PathBuf {
    out.unwrap_or_else(rootfs::default_out)
}

pub(crate) fn main(args: ImageArgs) -> i32 {
    let result = match args.command {
        ImageCommand::Build(a) => build(a),
        ImageCommand::List(a) => list(&out_dir(a.out), a.json),
        ImageCommand::Verify(a) => {
            let hint = format!("codecage image build {}", a.name);
            rootfs::verify(&out_dir(a.out), &a.name, &hint)
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("codecage: {e:#}");
            1
        }
    }
}

fn build(a: BuildArgs) -> anyhow::Result<()> {
    let recipes = rootfs::search_path(a.recipes.as_deref());
    rootfs::build(&rootfs::BuildRequest {
        recipe: &a.recipe,
        recipes: &recipes,
        out: &out_dir(a.out),
        force: a.force,
        verbose: a.verbose,
        program: "codecage",
    })
}

fn list(out: &Path, json: bool) -> anyhow::Result<()> {
    let images = rootfs::list(out)?;
    if json {
        let images: Vec<serde_json::Value> = images.iter().map(rootfs::Image::to_json).collect();
        super::print_json_value(&serde_json::json!({ "out": out, "images": images }));
        return Ok(());
    }
    if images.is_empty() {
        eprintln!(
            "no images in {} (codecage image build [RECIPE] builds one)",
            out.display()
        );
        return Ok(());
    }
    println!(
        "  {:<16} {:<12} {:>10}  {:<20}  PATH",
        "RECIPE", "HASH", "SIZE", "BUILT"
    );
    for image in &images {
        println!(
            "{} {:<16} {:<12} {:>10}  {:<20}  {}",
            if image.current { '*' } else { ' ' },
            image.recipe,
            &image.hash[..image.hash.len().min(12)],
            rootfs::build::human_bytes(image.size_bytes),
            image.built_at,
            image.path.display()
        );
    }
    Ok(())
}
