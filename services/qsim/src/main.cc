// musku_qsim MODEL.json|- [--control] [--progress[=SECONDS]]: runs a normalised model (written by
// `musku qsim`) and prints the result document as JSON on stdout. Exit status: 0 ok, 3 malformed
// model, 2 usage, 1 internal error. With --control (the model from a file, control_interval_s >
// 0), every interval's figures go to stdout as one JSON line and the engine reads the
// controller's answer, one JSON line, from stdin (musku/qsim/power.py); the result document is the
// last line. With --progress, a line "progress SIM_T_S END_S COMPLETED MAX_REQUESTS" goes to
// stderr at most every SECONDS of wall time (default 0.25; musku/qsim/engine.py reads them).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine.h"

int main(int argc, char** argv) {
  bool control = false, usage = argc < 2;
  double progress_s = 0;
  for (int i = 2; i < argc && !usage; ++i) {
    const std::string a = argv[i];
    if (a == "--control") {
      control = true;
    } else if (a == "--progress") {
      progress_s = 0.25;
    } else if (a.rfind("--progress=", 0) == 0) {
      char* end = nullptr;
      progress_s = std::strtod(a.c_str() + 11, &end);
      usage = *end != '\0' || !(progress_s > 0 && progress_s < 1e6);
    } else {
      usage = true;
    }
  }
  if (usage) {
    std::fprintf(stderr, "usage: musku_qsim MODEL.json|- [--control] [--progress[=SECONDS]]\n");
    return 2;
  }
  const std::string path = argv[1];
  nlohmann::json doc;
  try {
    if (path == "-") {
      doc = nlohmann::json::parse(std::cin);
    } else {
      std::ifstream in(path);
      if (!in) {
        std::fprintf(stderr, "musku_qsim: error: cannot open %s\n", path.c_str());
        return 3;
      }
      doc = nlohmann::json::parse(in);
    }
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "musku_qsim: error: %s: not JSON: %s\n", path.c_str(), e.what());
    return 3;
  }
  try {
    musku::qsim::Model model = musku::qsim::ParseModel(doc);
    model.progress_interval_s = progress_s;
    const nlohmann::json out =
        control ? musku::qsim::Simulate(model,
                                        [](const nlohmann::json& rep) {
                                          std::cout << rep.dump() << "\n" << std::flush;
                                          std::string line;
                                          if (!std::getline(std::cin, line))
                                            return nlohmann::json{{"stop", true}};
                                          return nlohmann::json::parse(line);
                                        })
                : musku::qsim::Simulate(model);
    std::cout << out.dump() << "\n";
  } catch (const musku::qsim::ModelError& e) {
    std::fprintf(stderr, "musku_qsim: error: %s: %s\n", path.c_str(), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "musku_qsim: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
