mod common;
mod host;

mod basic;
mod bombs;
mod cleanup;
mod escape;
mod fs;
mod hardening;
mod image;
mod isolation;
mod kmem;
mod library;
mod limits;
mod portability;
mod profiles;
mod server;
mod sessions;
