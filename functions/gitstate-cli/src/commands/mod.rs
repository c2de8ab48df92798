//! One module a group of commands; `main` parses the command line and calls into them.

pub mod admin;
pub mod fold;
pub mod keys;
pub mod remote;
pub mod serve;
pub mod users;
