// musku_qsim MODEL.json|- [--control]: runs a normalised model (written by `musku qsim`) and
// prints the result document as JSON on stdout. Exit status: 0 ok, 3 malformed model, 1 internal
// error. With --control (the model from a file, control_interval_s > 0), every interval's figures
// go to stdout as one JSON line and the engine reads the controller's answer, one JSON line, from
// stdin (musku/qsim/power.py); the result document is the last line.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine.h"

int main(int argc, char** argv) {
  const bool control = argc == 3 && std::string(argv[2]) == "--control";
  if (argc != 2 && !control) {
    std::fprintf(stderr, "usage: musku_qsim MODEL.json|- [--control]\n");
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
    const musku::qsim::Model model = musku::qsim::ParseModel(doc);
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
