// Visibility of the engine's API. The engine is one shared library loaded once per process;
// interpreter copies are compiled with hidden visibility, so every class and function they call
// must be exported from here for calls, typeids and catch clauses to resolve to the one engine.
#pragma once

#define OROCHI_ENGINE_API __attribute__((visibility("default")))
