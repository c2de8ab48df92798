//! Errors as the logs print them.

/// The error and all its sources, `outer: cause: root cause`, for the log.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_source_is_named_in_order() {
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(super::chain(&error), "outer: inner");
        assert_eq!(super::chain(&std::io::Error::other("alone")), "alone");
    }
}
