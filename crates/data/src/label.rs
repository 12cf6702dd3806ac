//! Labels: what a task predicts (classes or a score), the fixed order of its class names, and
//! the mapping from a label as written in a file to the id the model is trained on.
//!
//! The order follows Hugging Face's `run_glue.py`: a GLUE task has its own fixed list; labels
//! read from the user's files are sorted (numerically when every one is an integer, else as
//! text), and the k-th is id k. Labels are regression scores when the task says so or when the
//! training labels are numbers and not all integers.

/// What the model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Problem {
    /// One of several classes (cross-entropy).
    Classification,
    /// One real score (mean squared error).
    Regression,
}

/// The label of one example.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Label {
    /// A class id.
    Class(u32),
    /// A regression target.
    Score(f32),
}

impl Label {
    /// The class id, or `None` for a score.
    pub fn class(self) -> Option<u32> {
        match self {
            Label::Class(c) => Some(c),
            Label::Score(_) => None,
        }
    }

    /// The regression target, or `None` for a class.
    pub fn score(self) -> Option<f32> {
        match self {
            Label::Class(_) => None,
            Label::Score(s) => Some(s),
        }
    }
}

/// What the labels of a task are to be, when its files do not fix them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LabelHint {
    /// Found from the training labels.
    #[default]
    Infer,
    /// Classes, with at least this many outputs (`--num-labels`; `None`: as many as there are
    /// labels).
    Classes(Option<usize>),
    /// A regression score.
    Regression,
}

/// A task's labels: the problem and, for classification, the class names in id order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelSet {
    problem: Problem,
    names: Vec<String>,
}

impl LabelSet {
    /// Classes named `names`, id = position.
    pub fn classes<S: AsRef<str>>(names: &[S]) -> Self {
        LabelSet { problem: Problem::Classification, names: names.iter().map(|n| n.as_ref().to_string()).collect() }
    }

    /// A regression score.
    pub fn regression() -> Self {
        LabelSet { problem: Problem::Regression, names: Vec::new() }
    }

    /// The labels a task's training labels (as written, trimmed) make under `hint`; the error
    /// says why there are none.
    pub fn infer<S: AsRef<str>>(labels: &[S], hint: LabelHint) -> Result<Self, String> {
        let labels: Vec<&str> = labels.iter().map(|l| l.as_ref().trim()).collect();
        if labels.is_empty() {
            return Err("no labelled rows to learn the labels from".into());
        }
        let numbers: Option<Vec<f64>> = labels.iter().map(|l| parse_number(l)).collect();
        let all_integers = labels.iter().all(|l| l.parse::<i64>().is_ok());
        let regression = match hint {
            LabelHint::Regression => true,
            LabelHint::Classes(_) => false,
            LabelHint::Infer => numbers.is_some() && !all_integers,
        };
        if regression {
            return match labels.iter().find(|l| parse_number(l).is_none()) {
                Some(bad) => Err(format!("label `{bad}` is not a number, and the task is a regression")),
                None => Ok(Self::regression()),
            };
        }
        let mut names: Vec<String> = if all_integers {
            let mut values: Vec<i64> = labels.iter().filter_map(|l| l.parse().ok()).collect();
            values.sort_unstable();
            values.dedup();
            values.iter().map(i64::to_string).collect()
        } else {
            if let (Some(float), true) = (labels.iter().find(|l| is_fraction(l)), numbers.is_some()) {
                return Err(format!("float label `{float}` in a classification task"));
            }
            let mut names: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
            names.sort_unstable();
            names.dedup();
            names
        };
        if let LabelHint::Classes(Some(wanted)) = hint {
            if names.len() > wanted {
                return Err(format!(
                    "--num-labels {wanted}, but the training labels are {}: {}",
                    names.len(),
                    names.join(", ")
                ));
            }
            let seen = names.len();
            names.extend((seen..wanted).map(|i| format!("LABEL_{i}")));
        }
        if names.len() < 2 {
            return Err(format!(
                "every training label is `{}`: classification needs 2 or more labels",
                names.first().map_or("", String::as_str)
            ));
        }
        Ok(LabelSet { problem: Problem::Classification, names })
    }

    /// The problem.
    pub fn problem(&self) -> Problem {
        self.problem
    }

    /// The class names in id order (empty for regression).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Outputs of the model's head: the classes, or 1 for a score.
    pub fn outputs(&self) -> usize {
        match self.problem {
            Problem::Classification => self.names.len(),
            Problem::Regression => 1,
        }
    }

    /// The label written `text` (trimmed); the error is the reason a bad-row report gives.
    pub fn encode(&self, text: &str) -> Result<Label, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("empty label".into());
        }
        if self.problem == Problem::Regression {
            return parse_number(text)
                .map(|v| Label::Score(v as f32))
                .ok_or_else(|| format!("label `{text}` is not a number, and the task is a regression"));
        }
        if let Some(id) = self.names.iter().position(|n| n == text) {
            return Ok(Label::Class(id as u32));
        }
        if let Ok(value) = text.parse::<i64>() {
            if let Some(id) = self.names.iter().position(|n| n.parse::<i64>() == Ok(value)) {
                return Ok(Label::Class(id as u32));
            }
            // A head whose classes were never named (`LABEL_<i>`, Hugging Face's default) takes
            // its ids as written.
            let unnamed = usize::try_from(value).ok().filter(|&i| self.names.get(i) == Some(&format!("LABEL_{i}")));
            if let Some(id) = unnamed {
                return Ok(Label::Class(id as u32));
            }
        }
        if is_fraction(text) {
            return Err(format!("float label `{text}` in a classification task"));
        }
        Err(format!("label `{text}` not seen in training (labels: {})", self.names.join(", ")))
    }

    /// How a prediction is written: the class's name, or the score.
    pub fn name_of(&self, class: usize) -> &str {
        self.names.get(class).map_or("", String::as_str)
    }
}

/// A finite number, as Python's `float()` reads one (`nan` and `inf` are not labels).
fn parse_number(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A number that is not an integer literal (`0.5`, `1.0`, `2e3`).
fn is_fraction(text: &str) -> bool {
    parse_number(text).is_some() && text.parse::<i64>().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_sorted_integers_numerically_fractions_regress() {
        let set = LabelSet::infer(&["neutral", "entailment", "contradiction", "entailment"], LabelHint::Infer)
            .expect("strings");
        assert_eq!(set.names(), ["contradiction", "entailment", "neutral"]);
        assert_eq!(set.encode(" neutral ").expect("known"), Label::Class(2));
        let msg = set.encode("maybe").expect_err("unseen");
        assert!(msg.contains("`maybe` not seen in training") && msg.contains("contradiction, entailment"), "{msg}");
        let ints = LabelSet::infer(&["10", "2", "1", "2"], LabelHint::Infer).expect("ints");
        assert_eq!(ints.names(), ["1", "2", "10"]);
        assert_eq!(ints.encode("10").expect("ten"), Label::Class(2));
        assert!(ints.encode("2.5").expect_err("float").contains("float label `2.5` in a classification task"));
        let scores = LabelSet::infer(&["3.8", "1", "0.25"], LabelHint::Infer).expect("floats");
        assert_eq!((scores.problem(), scores.outputs()), (Problem::Regression, 1));
        assert_eq!(scores.encode("4").expect("score"), Label::Score(4.0));
        assert!(scores.encode("high").is_err());
    }

    #[test]
    fn hints_decide_and_refuse_what_does_not_fit() {
        let regression = LabelSet::infer(&["1", "2"], LabelHint::Regression).expect("regression");
        assert_eq!(regression.problem(), Problem::Regression);
        let err = LabelSet::infer(&["0.5", "1"], LabelHint::Classes(None)).expect_err("float");
        assert!(err.contains("float label `0.5`"), "{err}");
        let padded = LabelSet::infer(&["0", "1"], LabelHint::Classes(Some(3))).expect("padded");
        assert_eq!(padded.names(), ["0", "1", "LABEL_2"]);
        let err = LabelSet::infer(&["a", "b", "c"], LabelHint::Classes(Some(2))).expect_err("too many");
        assert!(err.contains("--num-labels 2") && err.contains("a, b, c"), "{err}");
        assert!(LabelSet::infer(&["x", "x"], LabelHint::Infer).expect_err("one class").contains("2 or more"));
        assert!(LabelSet::infer::<&str>(&[], LabelHint::Infer).is_err());
        assert!(LabelSet::classes(&["0", "1"]).encode("").expect_err("empty").contains("empty label"));
        assert_eq!(LabelSet::classes(&["LABEL_0", "LABEL_1"]).encode("1").expect("unnamed"), Label::Class(1));
    }
}
