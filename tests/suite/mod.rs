mod common;
mod host;

mod basic;
mod bombs;
mod cleanup;
mod escape;
mod fs;
mod image;
mod isolation;
mod library;
mod limits;
mod profiles;
