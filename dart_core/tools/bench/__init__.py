"""The benchmark: `python -m dart_core bench ...`.

Every method decodes every prompt in the same run, methods alternating per prompt (the order rotates from prompt
to prompt) so that drift in machine speed falls on all of them alike. The target is loaded once per dtype.

Methods:
  hf_generate  transformers `model.generate` (plain decoding): the speed yardstick
  vanilla      our decoding loop with no drafts (one token per target forward)
  hf_pld       transformers' built-in prompt lookup (`generate(..., prompt_lookup_num_tokens=N)`)
  pld          our prompt-lookup proposer
  dart         DART (draft head + n-gram-guided tree search)
  dart_pld     DART plus prompt lookup's continuation as one more branch of the tree

The report's fields are defined in `report`, the runs file and the rules of --resume in `runs_file`.

Modules, one job each:
  methods    the bench's method names: transformers' two beside dart_core.methods'
  options    the command-line arguments and the parsing of their comma lists
  plan       BenchPlan: every setting of one benchmark, checked and resolved once from the arguments
  prompts    the prompts of the workloads and of a prompt file, and what makes a prompt the same one later
  runs       a run, its key, and which runs make up whole prompts compared with their plain reference
  settings   what a resumed benchmark must share with the runs it continues
  runs_file  the runs file: one record a finished run, read back by --resume
  runner     decoding one prompt with one method, ours and transformers'
  loop       decoding every planned run not yet done, a dtype at a time
  report     the runs summed per method, dtype, temperature and workload, and the printed table
  command    run_bench and the `bench` subcommand: plan, decode, write the report (also when interrupted)
"""

from .command import register, run_bench
from .methods import HF_METHODS, METHODS, PLAIN
from .options import DTYPE_NAMES, parse_dtypes, parse_methods, parse_temperatures
from .plan import BenchPlan, plan_from_args
from .prompts import BenchPrompt, load_prompts, prompt_ident
from .report import BENCH_FORMAT, Cell, build_report, format_table
from .runner import Runner
from .runs import Run, first_difference, key_of, run_key
from .runs_file import RUNS_FORMAT, RunsFile, run_from_dict, run_to_dict, runs_path

__all__ = ["BENCH_FORMAT", "DTYPE_NAMES", "HF_METHODS", "METHODS", "PLAIN", "RUNS_FORMAT", "BenchPlan",
           "BenchPrompt", "Cell", "Run", "Runner", "RunsFile", "build_report", "first_difference", "format_table",
           "key_of", "load_prompts", "parse_dtypes", "parse_methods", "parse_temperatures", "plan_from_args",
           "prompt_ident", "register", "run_bench", "run_from_dict", "run_key", "run_to_dict", "runs_path"]
