#pragma once
// The exaserve subcommands. Each returns the process exit status; errors go to
// stderr as one line naming the problem.

namespace exa::app {

int cmd_gen_model(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_check_model(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);
int cmd_bench_engine(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_chaos(int argc, char** argv);
int cmd_sim(int argc, char** argv);
int cmd_controller(int argc, char** argv);
int cmd_node(int argc, char** argv);
int cmd_gateway(int argc, char** argv);
int cmd_gen_certs(int argc, char** argv);
int cmd_events(int argc, char** argv);
int cmd_keys(int argc, char** argv);
int cmd_aggregate(int argc, char** argv);
int cmd_metric_names(int argc, char** argv);

}  // namespace exa::app
