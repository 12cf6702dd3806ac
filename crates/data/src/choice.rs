//! Which task a run trains on, as the command line and the settings file say it: a GLUE task
//! by name, or the user's files with their columns.

use std::path::{Path, PathBuf};

use crate::{DataError, GlueTask, LabelHint, Quoting, Source, Task};

/// The settings that choose a task (each as `ringtune train`'s flag of the same name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskChoice {
    /// A GLUE task's name (default: mrpc, unless `train_file` is set).
    pub task: Option<String>,
    /// The GLUE task's folder.
    pub data: Option<PathBuf>,
    /// The user's training file.
    pub train_file: Option<PathBuf>,
    /// The user's validation file.
    pub validation_file: Option<PathBuf>,
    /// The user's test file.
    pub test_file: Option<PathBuf>,
    /// The user's text columns.
    pub text_columns: Option<Vec<String>>,
    /// The user's label column.
    pub label_column: Option<String>,
    /// How the user's `.tsv` files quote (default: detected).
    pub quoting: Option<Quoting>,
    /// Outputs of the head (1: a regression).
    pub num_labels: Option<usize>,
}

impl TaskChoice {
    /// The name of the task these settings train, without reading any file: `files` for the
    /// user's files, else the GLUE task's (`mrpc` by default).
    pub fn task_name(&self) -> Result<&'static str, DataError> {
        match (&self.train_file, &self.task) {
            (Some(_), _) => Ok("files"),
            (None, task) => Ok(GlueTask::from_name(task.as_deref().unwrap_or("mrpc"))?.name()),
        }
    }

    /// The task and where its data is: the user's files when `train_file` is set (relative
    /// paths from `root`), else the GLUE task (MRPC by default) in `data` or where
    /// [`crate::glue_dir`] finds it. Settings that do not go together are refused by flag.
    pub fn task(&self, root: &Path) -> Result<Task, DataError> {
        let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { root.join(p) };
        let Some(train) = &self.train_file else {
            let only_with_files = [
                ("validation-file", self.validation_file.is_some()),
                ("test-file", self.test_file.is_some()),
                ("text-columns", self.text_columns.is_some()),
                ("label-column", self.label_column.is_some()),
                ("quoting", self.quoting.is_some()),
            ];
            if let Some((flag, _)) = only_with_files.iter().find(|(_, set)| *set) {
                return Err(DataError::Settings(format!("--{flag} is for your own files: give --train-file too")));
            }
            let glue = GlueTask::from_name(self.task.as_deref().unwrap_or("mrpc"))?;
            let wanted = glue.labels().outputs();
            if let Some(n) = self.num_labels.filter(|&n| n != wanted) {
                return Err(DataError::Settings(format!("--num-labels {n}: {} has {wanted}", glue.name())));
            }
            let dir = match &self.data {
                Some(d) => resolve(d),
                None => crate::glue_dir(root, glue)?.path,
            };
            return Ok(Task::glue(glue, &dir));
        };
        if let Some(task) = &self.task {
            return Err(DataError::Settings(format!(
                "--task {task} reads GLUE's files from --data; with --train-file leave --task out"
            )));
        }
        let hint = match self.num_labels {
            None => LabelHint::Infer,
            Some(0) => {
                return Err(DataError::Settings("--num-labels 0: use 1 for a regression, 2 or more for classes".into()))
            }
            Some(1) => LabelHint::Regression,
            Some(n) => LabelHint::Classes(Some(n)),
        };
        Ok(Task {
            name: "files".into(),
            source: Source::Files {
                train: resolve(train),
                validation: self.validation_file.as_deref().map(resolve),
                test: self.test_file.as_deref().map(resolve),
                text_columns: self.text_columns.clone(),
                label_column: self.label_column.clone(),
                quoting: self.quoting,
                hint,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_come_from_a_name_or_the_users_files() {
        let root = Path::new("/work");
        let files = TaskChoice {
            train_file: Some("mine/train.csv".into()),
            validation_file: Some("/abs/dev.jsonl".into()),
            num_labels: Some(1),
            ..TaskChoice::default()
        };
        let task = files.task(root).expect("files");
        let Source::Files { train, validation, hint, .. } = &task.source else { panic!("{task:?}") };
        assert_eq!(
            (train.as_path(), validation.as_deref(), *hint),
            (Path::new("/work/mine/train.csv"), Some(Path::new("/abs/dev.jsonl")), LabelHint::Regression)
        );
        assert_eq!(files.task_name().expect("files"), "files");
        assert_eq!(TaskChoice::default().task_name().expect("default"), "mrpc");
        let sst2 = TaskChoice { task: Some("SST-2".into()), data: Some("glue/SST-2".into()), ..TaskChoice::default() };
        assert_eq!(sst2.task_name().expect("sst2"), "sst2");
        assert_eq!(sst2.task(root).expect("sst2"), Task::glue(GlueTask::Sst2, Path::new("/work/glue/SST-2")));
        for (config, named) in [
            (TaskChoice { task: Some("sst2".into()), ..files.clone() }, "with --train-file leave --task out"),
            (
                TaskChoice { text_columns: Some(vec!["a".into()]), ..TaskChoice::default() },
                "--text-columns is for your own files",
            ),
            (TaskChoice { quoting: Some(Quoting::None), ..TaskChoice::default() }, "--quoting is for your own files"),
            (
                TaskChoice {
                    task: Some("mnli".into()),
                    num_labels: Some(2),
                    data: Some("d".into()),
                    ..TaskChoice::default()
                },
                "mnli has 3",
            ),
            (TaskChoice { task: Some("squad".into()), ..TaskChoice::default() }, "unknown task `squad`"),
            (TaskChoice { num_labels: Some(0), ..files.clone() }, "--num-labels 0"),
        ] {
            let msg = config.task(root).expect_err(named).to_string();
            assert!(msg.contains(named), "{msg}");
        }
    }
}
