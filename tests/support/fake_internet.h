// The fake internet of network tests.
#pragma once
