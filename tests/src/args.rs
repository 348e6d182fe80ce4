//! The command lines of the test tools in `src/bin`: positional arguments
//! first, then `--name value` flags in any order.

/// A tool's arguments, without the program name.
pub struct Flags {
    args: Vec<String>,
}

impl Flags {
    /// The arguments this process was started with.
    pub fn from_env() -> Flags {
        Flags::new(std::env::args().skip(1).collect())
    }

    pub fn new(args: Vec<String>) -> Flags {
        Flags { args }
    }

    /// Argument `i` (from 0), if there are that many.
    pub fn positional(&self, i: usize) -> Option<&str> {
        self.args.get(i).map(String::as_str)
    }

    /// The argument after the first `name` (e.g. `"--count"`), or `default`
    /// when `name` is absent or last.
    pub fn value(&self, name: &str, default: &str) -> String {
        self.args
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| default.into())
    }

    /// [`Flags::value`] as a number; the error says which flag is not one.
    pub fn number<T: std::str::FromStr>(&self, name: &str, default: &str) -> Result<T, String> {
        self.value(name, default)
            .parse()
            .map_err(|_| format!("{name}: a number"))
    }
}

#[cfg(test)]
mod tests {
    use super::Flags;

    fn flags(args: &[&str]) -> Flags {
        Flags::new(args.iter().map(|a| a.to_string()).collect())
    }

    #[test]
    fn positionals_and_values() {
        let f = flags(&["127.0.0.1:4420", "nqn.x", "--count", "3", "--kato", "5s"]);
        assert_eq!(f.positional(0), Some("127.0.0.1:4420"));
        assert_eq!(f.positional(1), Some("nqn.x"));
        assert_eq!(f.positional(6), None);
        assert_eq!(f.value("--count", "1"), "3");
        assert_eq!(f.value("--kato", "1s"), "5s");
        assert_eq!(f.value("--retry", "20ms"), "20ms");
        assert_eq!(f.number::<usize>("--count", "1"), Ok(3));
        assert_eq!(f.number::<usize>("--qd", "32"), Ok(32));
        assert_eq!(
            f.number::<usize>("--kato", "1"),
            Err("--kato: a number".to_string())
        );
    }

    #[test]
    fn a_flag_without_a_value_takes_the_default() {
        assert_eq!(flags(&["dev", "--qd"]).value("--qd", "32"), "32");
        assert_eq!(flags(&[]).positional(0), None);
    }
}
