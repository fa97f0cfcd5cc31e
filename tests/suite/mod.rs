mod common;

mod basic;
mod bombs;
mod cleanup;
mod escape;
mod fs;
mod isolation;
mod limits;
mod profiles;
